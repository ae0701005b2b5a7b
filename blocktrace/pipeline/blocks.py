"""From a request to a report: source -> blocks -> traces (-> gradients, flags) -> report dict.

The one path every command takes; cli/ only turns options into a request and a report
into text. `run_request` serves `run` and `check`, `compare_request` serves `compare`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from blocktrace.config import BlockConfig
from blocktrace.diagnose.compare import build_variants, describe, difference
from blocktrace.diagnose.diagnosis import block_context, conclude
from blocktrace.diagnose.grad import gradient_report, xiong_loss
from blocktrace.diagnose.health import evaluate
from blocktrace.errors import BlocktraceError, UsageError, WeightsError
from blocktrace.model.stack import build_stack
from blocktrace.pipeline.guard import memory_guard
from blocktrace.pipeline.report import Traced, block_report, stack_report, sweep_report
from blocktrace.progress import tick
from blocktrace.request import Analysis, RunRequest
from blocktrace.sources.inputs import random_input
from blocktrace.sources.loader import load_block
from blocktrace.sources.source import Source, prepare_source, resolve_device, torch_dtype, user_block_source
from blocktrace.sources.userblock import load_user_block
from blocktrace.tracing.stack import trace_stack
from blocktrace.vocab import SCHEMA_VERSION, Axis, ReportKind


def make_blocks(source: Source, request: RunRequest, n_layers: int,
                config: Optional[BlockConfig] = None) -> list[torch.nn.Module]:
    """n_layers blocks: seeded (layer l from seed + l) or the checkpoint's layers K..K+n-1."""
    config = (config or source.config).replace(n_layers=n_layers if source.checkpoint is None
                                               else source.config.n_layers)
    if source.checkpoint is None:
        blocks = build_stack(config, n_layers, request.seed, request.init)
    else:
        first = request.first_layer
        last = first + n_layers - 1
        if last >= source.info.n_layers:
            raise WeightsError(f"--layer {first} with --layers {n_layers} needs layers up to {last}, "
                               f"but the checkpoint has {source.info.n_layers} layers: 0–{source.info.n_layers - 1}")
        blocks = [load_block(source.checkpoint, source.info, first + i, config, torch_dtype(request.dtype))
                  for i in range(n_layers)]
    return place_blocks(blocks, request, source)


def place_blocks(blocks: list, request: RunRequest, source: Source) -> list:
    """Move blocks to the requested device and dtype; set their attention chunking and padding mask."""
    device, dtype = resolve_device(request.device), torch_dtype(request.dtype)
    for block in blocks:
        block.attend_with(None if source.token_mask is None else source.token_mask.to(device), request.attn_chunk)
    return [block.to(device=device, dtype=dtype) for block in blocks]


def batch_maker(source: Source, request: RunRequest):
    """Mini-batch k for gradients: the input itself first; fresh seeded noise after, for random input."""
    def make(k: int) -> torch.Tensor:
        if k == 0 or not source.input_varies:
            return source.x
        batch = source.x.shape[0] if source.x.dim() == 3 else None
        x = random_input(source.x.shape[-2], source.config.d_model, request.seed + k, batch)
        return x.to(source.x.device, source.x.dtype)
    return make


def _gradients(blocks, source: Source, request: RunRequest, batches: int):
    final_norm = not blocks[0].config.post_norm  # Pre-LN streams are not normalised: read out after LN
    loss = xiong_loss(blocks[0].config.d_model, request.seed, final_norm)
    return gradient_report(blocks, batch_maker(source, request), loss, batches=batches)


def _sweep_rows(source: Source, request: RunRequest, config, depths, batches: int) -> list[dict]:
    rows = []
    for done, depth in enumerate(depths):
        tick("depth", done, len(depths))
        grads = _gradients(make_blocks(source, request, depth, config), source, request, batches)
        rows.append({"depth": depth, "loss": grads.loss, "last_layer": grads.weight_norms[-1]})
    return rows


def _traced(blocks, source: Source, analysis: Analysis, request: RunRequest):
    return trace_stack(blocks, source.x, keep_tensors=analysis.keep_tensors, sample_token=analysis.token_index,
                       sample_size=analysis.n_values or 0, checks=analysis.checks, steps=request.step_names,
                       placement=analysis.placement, token_mask=source.token_mask,
                       expect_causal=request.expect_causal, attention_map=analysis.attention_map)


def run_blocks(blocks, source: Source, request: RunRequest, analysis: Analysis) -> Traced:
    """Trace the blocks: the report, the traces and the source's tokens."""
    traces = _out_of_memory_is_an_error(lambda: _traced(blocks, source, analysis, request))
    grads = _gradients(blocks, source, request, analysis.batches) if analysis.grad else None
    found = None
    if analysis.checks:
        found = conclude(evaluate(traces, grads), block_context(traces[0]))
    if len(traces) == 1 and not analysis.stacked:
        return Traced(block_report(source, traces[0], grads, found), traces, source.tokens)
    return Traced(stack_report(source, traces, grads, found), traces, source.tokens)


def _out_of_memory_is_an_error(compute):
    """What the size estimate did not foresee still ends in one line, not an allocator traceback."""
    try:
        return compute()
    except (MemoryError, torch.OutOfMemoryError) as error:
        raise BlocktraceError(f"out of memory: {str(error).splitlines()[0][:200] or 'allocation failed'}") from None
    except RuntimeError as error:
        if "can't allocate memory" in str(error) or "out of memory" in str(error):
            raise BlocktraceError(f"out of memory: {str(error).splitlines()[0][:200]}") from None
        raise


def _check_token_index(source: Source, analysis: Analysis) -> None:
    n_tokens = source.x.shape[-2]
    if analysis.n_values is not None and not -n_tokens <= analysis.token_index < n_tokens:
        raise UsageError(f"Invalid value for '--token-index': {analysis.token_index} is out of range: "
                         f"{n_tokens} tokens, valid 0–{n_tokens - 1}")


def run_user_block(request: RunRequest, analysis: Analysis) -> Traced:
    """A user's own nn.Module block (from --module): its forward is the user's code."""
    block = load_user_block(request.module)
    source = user_block_source(request, block)
    _check_token_index(source, analysis)
    block = block.to(device=source.x.device, dtype=source.x.dtype)
    return run_blocks([block], source, request, analysis)


def run_request(request: RunRequest, analysis: Analysis) -> Traced:
    """`run` and `check` of a block or a stack."""
    if request.module is not None:
        return run_user_block(request, analysis)
    source = prepare_source(request, memory_guard(request, analysis, max(analysis.depths)))
    _check_token_index(source, analysis)
    if len(analysis.depths) > 1:
        rows = _sweep_rows(source, request, None, analysis.depths, analysis.batches)
        return Traced(sweep_report(source, source.config, rows), [], source.tokens)
    return run_blocks(make_blocks(source, request, analysis.depths[0]), source, request, analysis)


def _differences(traces_a: list, traces_b: list) -> dict:
    """Per common step (one block) or per layer's output (a stack), and of the final outputs."""
    result = {"output": difference(traces_a[-1].output, traces_b[-1].output)}
    if len(traces_a) == 1:
        a, b = traces_a[0], traces_b[0]
        in_b = {step.name for step in b.steps}
        result["steps"] = [{"name": step.name, **difference(step.tensor, b.step(step.name).tensor)}
                           for step in a.steps if step.name in in_b]
    result["layers"] = [{"layer": i, **difference(a.output, b.output)} for i, (a, b) in
                        enumerate(zip(traces_a, traces_b))]
    return result


def _variants(source: Source, request: RunRequest, axis: Axis, values: list[str], depth: int):
    """Both variants at this depth, filled from the same source parameters, on the input's device."""
    origin = make_blocks(source, request, depth, source.native) if source.checkpoint is not None else None
    variants = build_variants(source.config, axis, values, n_layers=depth, seed=request.seed,
                              init=request.init, source=origin)
    if source.checkpoint is not None and "seed" in request.explicit and not any(v.unshared for v in variants):
        raise UsageError("--seed draws the parameters a variant has and the checkpoint lacks; here every parameter "
                         "of both variants comes from the checkpoint: drop --seed")
    for variant in variants:
        variant.blocks = place_blocks(variant.blocks, request, source)
    return variants


def _compare_sweep(source, request, analysis, axis, values) -> list[dict]:
    rows = {value: [] for value in values}
    configs = {}
    for done, depth in enumerate(analysis.depths):
        tick("depth", done, len(analysis.depths))
        for variant in _variants(source, request, axis, values, depth):
            grads = _gradients(variant.blocks, source, request, analysis.batches)
            rows[variant.value].append({"depth": depth, "loss": grads.loss, "last_layer": grads.weight_norms[-1]})
            configs[variant.value] = variant
    return [{"value": value, "config": configs[value].config.to_dict(),
             "unshared_parameters": configs[value].unshared,
             "report": sweep_report(source, configs[value].config, rows[value])} for value in values]


def compare_request(request: RunRequest, analysis: Analysis, axis: Axis, values: list[str]) -> dict:
    source = prepare_source(request, memory_guard(request, analysis, 3 * max(analysis.depths)))  # source + 2 variants
    differences = None
    if len(analysis.depths) > 1:
        entries = _compare_sweep(source, request, analysis, axis, values)
    else:
        entries, all_traces = [], []
        keep = dataclasses.replace(analysis, keep_tensors=True)
        for variant in _variants(source, request, axis, values, analysis.depths[0]):
            traced = run_blocks(variant.blocks, source, request, keep)
            report, traces = traced.report, traced.traces
            all_traces.append(traces)
            entries.append({"value": variant.value, "config": variant.config.to_dict(),
                            "unshared_parameters": variant.unshared, "report": report})
        differences = _differences(*all_traces)
    return {
        "schema": SCHEMA_VERSION, "kind": ReportKind.COMPARE.value, "axis": axis.value, "values": values,
        "seed": source.seed, "weights": source.weights, "tokens": source.tokens,
        "variants": entries, "differences": differences,
        "notes": describe(entries, differences),
    }

