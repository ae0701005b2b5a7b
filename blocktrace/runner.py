"""What `blocktrace run` does, as library calls: request -> block and input -> trace -> report.

Kept apart from cli.py so the CLI stays a thin layer of options and echo.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from blocktrace.block import build_block, execution_order
from blocktrace.config import BlockConfig
from blocktrace.errors import InputError, UsageError
from blocktrace.inputs import RANDOM_INPUT_NOTE, TOKEN_EMBEDDING_NOTE, random_input, split_tokens, tokens_to_input
from blocktrace.render import report_dict
from blocktrace.tracer import Trace, trace
from blocktrace.tracefile import check_output_path, save_trace_file

DEFAULT_SEQ_LEN = 5
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
SIZE_FIELDS = ("d_model", "n_heads", "d_ff")

__all__ = ["RunRequest", "prepare", "run_block", "save_run", "check_output_path"]


@dataclass
class RunRequest:
    """Everything `run` was asked, as plain values; `explicit` names the config fields the user set."""

    config_fields: dict
    explicit: set = field(default_factory=set)
    tokens_text: Optional[str] = None
    token_ids_text: Optional[str] = None
    text: Optional[str] = None
    input_path: Optional[Path] = None
    seq_len: Optional[int] = None
    batch: Optional[int] = None
    seed: int = 0
    weights: Optional[Path] = None
    layer: int = 0
    dtype: str = "float32"
    device: str = "cpu"


@dataclass
class Prepared:
    block: torch.nn.Module
    x: torch.Tensor
    tokens: Optional[list[str]]  # labels for tables and heatmaps
    note: str  # how x was made
    weights: Optional[dict] = None  # path, layout, layer, n_layers when real weights are used


@dataclass
class RunResult:
    trace: Trace
    report: dict
    tokens: Optional[list[str]]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available here (use --device cpu or auto)")
    return torch.device(name)


def parse_token_ids(text: str) -> list[int]:
    words = text.replace(",", " ").split()
    if not words:
        raise UsageError("--token-ids needs at least one id, e.g. --token-ids 464 3797 318")
    try:
        return [int(word) for word in words]
    except ValueError:
        raise UsageError(f"--token-ids takes integers, not {text!r}") from None


def _count_inputs(request: RunRequest) -> list[str]:
    given = {"--tokens": request.tokens_text, "--token-ids": request.token_ids_text,
             "--text": request.text, "--input": request.input_path}
    chosen = [name for name, value in given.items() if value is not None]
    if len(chosen) > 1:
        raise UsageError(f"{' and '.join(chosen)} both give the input: use one of them")
    return chosen


def _with_batch(x: torch.Tensor, batch: Optional[int]) -> torch.Tensor:
    return x if batch is None or x.dim() == 3 else x.expand(batch, *x.shape).contiguous()


def load_input_file(path: Path, d_model: int) -> torch.Tensor:
    from blocktrace.checkpoint import Checkpoint

    checkpoint = Checkpoint(path)
    names = checkpoint.keys
    name = "x" if "x" in names else (names[0] if len(names) == 1 else None)
    if name is None:
        raise InputError(f"{path} holds {len(names)} tensors and none is named 'x': "
                         f"found {', '.join(sorted(names)[:5])}")
    x = checkpoint.get(name, torch.float32)
    if x.dim() not in (2, 3) or x.shape[-1] != d_model:
        raise InputError(f"{path}: tensor {name!r} has shape {list(x.shape)}, expected [T, {d_model}] "
                         f"or [B, T, {d_model}]")
    return x


def _prepare_random(request: RunRequest, inputs: list[str]) -> Prepared:
    config = BlockConfig(**request.config_fields)
    if inputs and inputs[0] in ("--token-ids", "--text"):
        raise UsageError(f"{inputs[0]} needs real weights: add --weights PATH (or use --tokens)")
    block = build_block(config, request.seed)
    if request.input_path is not None:
        x = _with_batch(load_input_file(request.input_path, config.d_model), request.batch)
        return Prepared(block, x, None, f"tensor from {request.input_path}")
    if request.tokens_text is not None:
        tokens = split_tokens([request.tokens_text])
        if request.seq_len is not None and request.seq_len != len(tokens):
            raise UsageError(f"--seq-len {request.seq_len} contradicts the {len(tokens)} tokens given: "
                             "drop --seq-len")
        return Prepared(block, tokens_to_input(tokens, config.d_model, request.seed, request.batch),
                        tokens, TOKEN_EMBEDDING_NOTE)
    x = random_input(request.seq_len or DEFAULT_SEQ_LEN, config.d_model, request.seed, request.batch)
    return Prepared(block, x, None, RANDOM_INPUT_NOTE)


def _prepare_weights(request: RunRequest, inputs: list[str]) -> Prepared:
    from blocktrace import weights as w
    from blocktrace.checkpoint import Checkpoint
    from blocktrace.tokenizer import encode_text, token_labels

    if not inputs or inputs[0] == "--tokens":
        raise UsageError("with --weights the input must come from the checkpoint: --token-ids 464 3797 ..., "
                         "--text \"...\" (needs tokenizer.json beside the weights), or --input FILE.safetensors")
    dtype = DTYPES[request.dtype]
    checkpoint = Checkpoint(request.weights)
    info = w.model_info(checkpoint)
    w.check_layer(info, request.layer)
    overrides = {key: request.config_fields[key] for key in request.explicit}
    native = w.gpt2_config(checkpoint, info.prefix, {k: v for k, v in overrides.items() if k in SIZE_FIELDS})
    config = native.replace(**{k: v for k, v in overrides.items() if k not in SIZE_FIELDS})
    block = w.load_block(checkpoint, info, request.layer, config, dtype)
    weights = {"path": str(request.weights), "layout": info.layout, "layer": request.layer, "n_layers": info.n_layers}
    if request.input_path is not None:
        x = _with_batch(load_input_file(request.input_path, config.d_model).to(dtype), request.batch)
        return Prepared(block, x, None, f"tensor from {request.input_path}", weights)
    if request.text is not None:
        ids = encode_text(checkpoint.directory, request.text)
    else:
        ids = parse_token_ids(request.token_ids_text)
    x = w.embed_token_ids(checkpoint, info, ids, dtype)
    x = w.hidden_state_before(checkpoint, info, native, x, request.layer, dtype)
    via = f" and blocks 0–{request.layer - 1}" if request.layer else ""
    note = f"token ids through wte + wpe{via}"
    return Prepared(block, _with_batch(x, request.batch), token_labels(checkpoint.directory, ids), note, weights)


def prepare(request: RunRequest) -> Prepared:
    inputs = _count_inputs(request)
    prepared = _prepare_weights(request, inputs) if request.weights else _prepare_random(request, inputs)
    device = resolve_device(request.device)
    prepared.block = prepared.block.to(device=device, dtype=DTYPES[request.dtype])
    prepared.x = prepared.x.to(device=device, dtype=DTYPES[request.dtype])
    return prepared


def run_block(prepared: Prepared, *, seed: Optional[int], keep_tensors: bool = False,
              n_values: Optional[int] = None, token_index: int = 0) -> RunResult:
    result = trace(prepared.block, prepared.x, keep_tensors=keep_tensors,
                   sample_token=token_index, sample_size=n_values or 0)
    report = report_dict(result, tokens=prepared.tokens, input_note=prepared.note,
                         seed=None if prepared.weights else seed, weights=prepared.weights)
    return RunResult(result, report, prepared.tokens)


def save_run(path: Path, result: RunResult) -> None:
    save_trace_file(path, result.trace.tensors(), config=result.trace.config.to_dict(),
                    step_order=execution_order(result.trace.config), tokens=result.tokens)
