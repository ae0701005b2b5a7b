"""Text <-> token ids through a `tokenizer.json` beside the weights (optional `tokenizers` package)."""

from __future__ import annotations

from pathlib import Path

from blocktrace.errors import UsageError


def _load(directory: Path):
    path = directory / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError("--text needs the tokenizers package: pip install 'transformer-blocktrace[text]' "
                         "(or pass --token-ids)") from None
    return Tokenizer.from_file(str(path))


def encode_text(directory: Path, text: str) -> list[int]:
    tokenizer = _load(directory)
    if tokenizer is None:
        raise UsageError(f"--text needs a tokenizer.json beside the weights and {directory} has none: "
                         "pass --token-ids instead")
    ids = tokenizer.encode(text).ids
    if not ids:
        raise UsageError("--text produced no tokens: give some text")
    return ids


def token_labels(directory: Path, ids: list[int]) -> list[str]:
    """Each id as the text it stands for (spaces shown as ␣), or the id itself without a tokenizer."""
    try:
        tokenizer = _load(directory)
    except UsageError:
        tokenizer = None
    if tokenizer is None:
        return [str(i) for i in ids]
    labels = [tokenizer.decode([i]).replace(" ", "␣") for i in ids]
    return [label if label.strip() else str(i) for label, i in zip(labels, ids)]
