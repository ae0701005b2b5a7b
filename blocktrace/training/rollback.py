"""The step to roll back to: the last record before the first sign of trouble at which the run was still healthy.

No training framework offers this: Megatron-LM can re-run the current step, and people roll back
by hand. A record is healthy when it raises no finding at WARNING or worse; the point is the last
healthy record before the first sign (at `--fail-on`'s level), so the run's state there was judged
and found clean. None when no record before the first sign is healthy: the run was broken from
its start (a bug in the code or the setup), and rolling back cannot help — fix the cause and start
again. With checkpoints, the point is the checkpoint itself (its path); with a Watch's timeline,
the step, and the checkpoint to reload is the last one saved at or before it.
"""

from __future__ import annotations

from typing import Optional

from blocktrace.vocab import Level


def healthy(entry: dict) -> bool:
    """A record raising no finding at WARNING or worse."""
    return not any(Level(f["level"]).reaches(Level.WARNING) for f in entry.get("flags") or [])


def rollback_point(records: list[dict], first_step: Optional[int]) -> Optional[dict]:
    """The last healthy record before the record of `first_step` (None: no sign, or no healthy record before it)."""
    if first_step is None:
        return None
    before = [entry for entry in records if entry["step"] < first_step and healthy(entry)]
    if not before:
        return None
    return rollback_entry(before[-1])


def rollback_entry(point: dict) -> dict:
    """The rollback point as a report holds it: the record's step, checkpoint path and loss."""
    return {"step": point["step"], "path": point.get("path"), "loss": point.get("loss")}
