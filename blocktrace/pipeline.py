"""The work behind `blocktrace run` and `blocktrace compare`, returning report dicts.

runner.py provides the source (config, parameters' origin, input) and the blocks; this module
traces them, adds gradients and depth sweeps, and, for compare, the differences between two
variants built on the same parameters.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from blocktrace.diagnose.compare import build_variants, difference
from blocktrace.diagnose.grad import gradient_report
from blocktrace.render.report import SCHEMA_VERSION, block_report, stack_report, sweep_report
from blocktrace.sources.source import RunRequest, Source, batch_maker, make_blocks, place_blocks
from blocktrace.model.stack import trace_stack


@dataclass
class Analysis:
    """What to compute besides the trace."""

    depths: tuple[int, ...] = (1,)  # one depth: a block or a stack; several: a gradient sweep
    stacked: bool = False  # --layers was given: report per layer even for one block
    grad: bool = False
    batches: int = 1
    keep_tensors: bool = False
    n_values: Optional[int] = None
    token_index: int = 0
    checks: bool = False  # health checks (blocktrace.diagnose.health): flags column, `check`
    steps: Optional[dict] = None  # a user's block of unknown layout: its step submodules
    placement: str = "pre"  # ... and its wiring


def _gradients(blocks, source: Source, request: RunRequest, batches: int):
    final_norm = not blocks[0].config.post_norm  # Pre-LN streams are not normalised: read out after LN
    return gradient_report(blocks, batch_maker(source, request), seed=request.seed, batches=batches,
                           final_norm=final_norm)


def sweep_rows(source: Source, request: RunRequest, config, depths, batches: int) -> list[dict]:
    rows = []
    for depth in depths:
        blocks = make_blocks(source, request, depth, config)
        grads = _gradients(blocks, source, request, batches)
        rows.append({"depth": depth, "loss": grads.loss, "last_layer": grads.weight_norms[-1]})
    return rows


def _traced(blocks, source: Source, analysis: Analysis):
    return trace_stack(blocks, source.x, keep_tensors=analysis.keep_tensors, sample_token=analysis.token_index,
                       sample_size=analysis.n_values or 0, checks=analysis.checks, steps=analysis.steps,
                       placement=analysis.placement, token_mask=source.token_mask)


def run_blocks(blocks, source: Source, request: RunRequest, analysis: Analysis) -> tuple[dict, list]:
    """Trace the blocks; returns the report and the traces (for --save)."""
    traces = _traced(blocks, source, analysis)
    grads = _gradients(blocks, source, request, analysis.batches) if analysis.grad else None
    flags = None
    if analysis.checks:
        from blocktrace.diagnose.health import evaluate

        flags = evaluate(traces, grads)
    if len(traces) == 1 and not analysis.stacked:
        return block_report(source, traces[0], grads, flags), traces
    return stack_report(source, traces, grads, flags), traces


def run_user_block(block, source: Source, request: RunRequest, analysis: Analysis) -> tuple[dict, list]:
    """A user's own nn.Module block (from --module): its forward is the user's code."""
    from blocktrace.errors import InputError

    block = block.to(device=source.x.device)
    try:
        return run_blocks([block], source, request, analysis)
    except (RuntimeError, TypeError, ValueError) as error:  # raised inside the user's forward
        raise InputError(f"the block's forward raised {type(error).__name__}: {error}") from None


def run_report(source: Source, request: RunRequest, analysis: Analysis) -> tuple[dict, list]:
    if len(analysis.depths) > 1:
        return sweep_report(source, source.config, sweep_rows(source, request, None, analysis.depths,
                                                               analysis.batches)), []
    blocks = make_blocks(source, request, analysis.depths[0])
    return run_blocks(blocks, source, request, analysis)


def _differences(traces_a: list, traces_b: list) -> dict:
    """Per common step (one block) or per layer's output (a stack), and of the final outputs."""
    result = {"output": difference(traces_a[-1].output, traces_b[-1].output)}
    if len(traces_a) == 1:
        a, b = traces_a[0], traces_b[0]
        result["steps"] = [{"name": step.name, **difference(step.tensor, b.step(step.name).tensor)}
                           for step in a.steps]
    result["layers"] = [{"layer": i, **difference(a.output, b.output)} for i, (a, b) in
                        enumerate(zip(traces_a, traces_b))]
    return result


def _variants(source: Source, request: RunRequest, axis: str, values: list[str], depth: int):
    """Both variants at this depth, filled from the same source parameters, on the input's device."""
    origin = make_blocks(source, request, depth, source.native) if source.checkpoint is not None else None
    variants = build_variants(source.config, axis, values, n_layers=depth, seed=request.seed,
                              init=request.init, source=origin)
    for variant in variants:
        variant.blocks = place_blocks(variant.blocks, request, source)
    return variants


def _compare_sweep(source, request, analysis, axis, values) -> list[dict]:
    rows = {value: [] for value in values}
    configs = {}
    for depth in analysis.depths:
        for variant in _variants(source, request, axis, values, depth):
            grads = _gradients(variant.blocks, source, request, analysis.batches)
            rows[variant.value].append({"depth": depth, "loss": grads.loss, "last_layer": grads.weight_norms[-1]})
            configs[variant.value] = variant
    return [{"value": value, "config": configs[value].config.to_dict(),
             "unshared_parameters": configs[value].unshared,
             "report": sweep_report(source, configs[value].config, rows[value])} for value in values]


def compare_report(source: Source, request: RunRequest, analysis: Analysis, axis: str, values: list[str]) -> dict:
    from blocktrace.diagnose.compare import describe

    differences = None
    if len(analysis.depths) > 1:
        entries = _compare_sweep(source, request, analysis, axis, values)
    else:
        entries, all_traces = [], []
        for variant in _variants(source, request, axis, values, analysis.depths[0]):
            report, traces = run_blocks(variant.blocks, source, request, _keep(analysis))
            all_traces.append(traces)
            entries.append({"value": variant.value, "config": variant.config.to_dict(),
                            "unshared_parameters": variant.unshared, "report": report})
        differences = _differences(*all_traces)
    return {
        "schema": SCHEMA_VERSION, "kind": "compare", "axis": axis, "values": values,
        "seed": source.seed, "weights": source.weights, "tokens": source.tokens,
        "variants": entries, "differences": differences,
        "notes": describe(axis, entries, differences),
    }


def _keep(analysis: Analysis) -> Analysis:
    return dataclasses.replace(analysis, keep_tensors=True)
