"""Text <-> token ids through a `tokenizer.json` beside the weights (optional `tokenizers` package).

The ids are the real tokens only: padding and truncation configured in tokenizer.json are
switched off (padding would reach the block as tokens the model never sees together with the
text; truncation would drop text silently). Special tokens are labelled by their own text.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional

from blocktrace.errors import InputError, UsageError
from blocktrace.sources.reading import read_text

TOKENIZER_FILE = "tokenizer.json"


def _load(directory: Path):
    """The directory's tokenizer (None without one), parsed once while the file stays as it is: encoding a text file
    line by line, labelling the tokens and counting the unknown ones all ask for it."""
    path = directory / TOKENIZER_FILE
    if not path.is_file():
        return None
    stamp = path.stat()
    return _parsed(str(path), stamp.st_mtime_ns, stamp.st_size)


@functools.lru_cache(maxsize=4)
def _parsed(path: str, mtime_ns: int, size: int):
    """tokenizer.json read and set up; the modification time and size are the cache's key, not read here."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError("--text needs the tokenizers package: pip install -e '.[text]' "
                         "(or pass --token-ids)") from None
    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception as error:  # the tokenizers library raises its own exception types
        raise InputError(f"{path} is not a valid tokenizer file: {str(error).splitlines()[0][:200]}") from None
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def encode_text(directory: Path, text: str, special_tokens: bool = True) -> list[int]:
    tokenizer = _load(directory)
    if tokenizer is None:
        raise UsageError(f"--text needs a {TOKENIZER_FILE} beside the weights and {directory} has none: "
                         "pass --token-ids instead")
    try:
        ids = tokenizer.encode(text, add_special_tokens=special_tokens).ids
    except Exception as error:
        raise InputError(f"{directory / TOKENIZER_FILE} cannot encode the text: {error}") from None
    if not ids:
        raise UsageError("--text produced no tokens: give some text")
    return ids


def unknown_tokens_note(directory: Path, sequences: list[list[int]]) -> Optional[str]:
    """A note when the tokenizer read some of the text as its unknown token (a word outside its vocabulary, which
    the block then sees as one embedding whatever the word was); None when it knew every word."""
    tokenizer = _load(directory)
    unknown = getattr(tokenizer.model, "unk_token", None) if tokenizer is not None else None
    unknown_id = tokenizer.token_to_id(unknown) if isinstance(unknown, str) else None
    if unknown_id is None:
        return None
    count, total = sum(seq.count(unknown_id) for seq in sequences), sum(map(len, sequences))
    if count == 0:
        return None
    return (f"{count} of the text's {total} tokens are {unknown} (id {unknown_id}): words outside the tokenizer's "
            "vocabulary, each traced as that one token")


def token_labels(directory: Path, ids: list[int]) -> tuple[list[str], Optional[str]]:
    """Each id as the text it stands for (spaces shown as ␣), and a note when that is not possible.

    Labels only decorate the tables: without a tokenizer, or with one that cannot be read,
    the ids themselves are the labels (and the note says why).
    """
    try:
        tokenizer = _load(directory)
    except (UsageError, InputError) as error:
        return [str(i) for i in ids], f"token labels are ids: {error}"
    if tokenizer is None:
        return [str(i) for i in ids], None
    special = {token.content for token in tokenizer.get_added_tokens_decoder().values() if token.special}
    labels = []
    for i in ids:
        piece = tokenizer.id_to_token(i)
        text = piece if piece in special else tokenizer.decode([i], skip_special_tokens=False).replace(" ", "␣")
        labels.append(text if text and text.strip() else str(i))
    return labels, None


def mask_token(directory: Path) -> tuple[Optional[int], set]:
    """BERT's [MASK] id (None when the tokenizer has none) and the ids of every special token."""
    tokenizer = _load(directory)
    if tokenizer is None:
        return None, set()
    special = {index for index, token in tokenizer.get_added_tokens_decoder().items() if token.special}
    return tokenizer.token_to_id("[MASK]"), special


def read_text_file(path: Path) -> list[str]:
    """The non-empty lines of a UTF-8 text file: one sequence each."""
    text = read_text(Path(path), "--text-file")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise InputError(f"{path} holds no text: give one sequence per line")
    return lines
