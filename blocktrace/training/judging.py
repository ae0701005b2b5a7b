"""A Watch record judged: the blocks' health checks on the record's traces, the dynamics against the records
before it, concluded into flags and a diagnosis; and, at the first record with an error, the step to roll back to."""

from __future__ import annotations

import warnings
from typing import Optional

from torch import nn

from blocktrace.diagnose.diagnosis import Context, conclude
from blocktrace.diagnose.dynamics import judge
from blocktrace.diagnose.grad import GradientReport
from blocktrace.diagnose.health import ModelEvidence, evaluate
from blocktrace.diagnose.history import History
from blocktrace.diagnose.weights import weight_summary
from blocktrace.training.blocks import stored_dtype
from blocktrace.training.rollback import healthy
from blocktrace.training.settings import optimizer_settings
from blocktrace.training.timeline import diagnosis_entries, flag_entries
from blocktrace.vocab import Level

FIRST_ERROR_WARNING = "blocktrace.Watch: first error at step"  # the rollback warning's opening words


def judge_record(entry: dict, traces: list, host: dict, history: History, checks: bool, blocks: list[nn.Module],
                 optimizer) -> None:
    """The record's findings — the blocks' checks and the dynamics against the records before — concluded into
    its "flags" and "diagnosis"."""
    context = Context(post_norm=any(t.wiring.stream_normalised for t in traces), step=entry["step"])
    scale = (host.get("loop") or {}).get("loss_scale")
    findings = []
    if traces and checks:
        findings = _block_findings(traces, host["grads"], host["weights"], entry["step"], blocks, optimizer,
                                   isinstance(scale, float) and scale > 1)
    if checks:
        findings += judge(history, entry)
    found = conclude(findings, context)
    entry["flags"] = flag_entries([f.to_dict() for f in found.flags])
    entry["diagnosis"] = diagnosis_entries(found.diagnosis)


def _block_findings(traces: list, grads: list, weights: Optional[list], step: int, blocks: list[nn.Module],
                    optimizer, loss_scaled: bool) -> list:
    gradients = GradientReport(loss=float("nan"), batches=1, step_norms=[{"parameters": g} for g in grads
                                                                         if g is not None], weight_norms=[],
                               loss_scaled=loss_scaled)
    width = traces[0].input.shape[-1]  # the stream's: a bare matrix is a weight where it meets it
    evidence = ModelEvidence(weights=[weight_summary(w, width) for w in weights], n_layers=len(traces), step=step,
                             stored_dtype=stored_dtype(blocks[0]), optimizer=optimizer_settings(optimizer),
                             in_training=True)
    return evaluate(traces, gradients, evidence)


class Rollback:
    """The last healthy record so far, and at the first record with an error the step to roll back to — in the
    record and in one warning, since a loop may run for hours past it."""

    def __init__(self):
        self.last_healthy: Optional[int] = None  # the last record's step that raised no warning or error
        self.trouble_seen = False

    def name(self, entry: dict) -> None:
        if healthy(entry):
            self.last_healthy = entry["step"]
            return
        errors = [f for f in entry["flags"] if f["level"] == Level.ERROR.value]
        if self.trouble_seen or not errors:
            return
        self.trouble_seen = True
        entry["rollback"] = self.last_healthy
        where = (f"the last healthy record is step {self.last_healthy}: roll back to the last checkpoint saved at or "
                 "before it" if self.last_healthy is not None else "no record before it was healthy: the run was "
                 "broken from its start")
        warnings.warn(f"{FIRST_ERROR_WARNING} {entry['step']} ({errors[0]['name']}: "
                      f"{errors[0]['detail']}); {where}", RuntimeWarning, stacklevel=4)
