"""The learning-rate schedulers that drive the optimizer the Watch was given, found without being handed to it.

A torch scheduler holds its optimizer (`scheduler.optimizer`); the optimizer holds no reference back. The objects
that refer to the optimizer are asked of Python's garbage collector (`gc.get_referrers`: one walk over the tracked
objects, ~25 ms for 350,000 of them), at a few records only, and only once a torch scheduler has marked the
optimizer's groups (`initial_lr`, which every LRScheduler built from step 0 sets): a loop without one pays nothing.
ReduceLROnPlateau sets no mark and is not sought: it takes the loss by definition. The schedulers found are held
weakly, so a scheduler the loop drops is not kept alive.

A LambdaLR built by one of transformers' schedule functions (`get_cosine_schedule_with_warmup` and its kin) holds
its lengths as the keywords of a `functools.partial` of a pure function of the step: those lengths are read, and
the function is evaluated at the scheduler's step and at the schedule's end, so the audit can say what the rate
does where the run has gone past the end the schedule was given (diagnose/audit.py); torch's CosineAnnealingLR and
PolynomialLR give their ends as attributes, and the rate they set says what they do past it.
"""

from __future__ import annotations

import functools
import gc
import math
import weakref
from typing import Optional

from torch.optim.lr_scheduler import CosineAnnealingLR, LRScheduler, PolynomialLR

SEARCHES = 3  # records at which the referrers are walked while no scheduler has been found
# the schedule functions whose lengths are read and which are evaluated: transformers' own, pure functions of the step
# (a lambda the user wrote may do anything when called, and is not)
SCHEDULE_MODULE = "transformers."


class Schedulers:
    """The optimizer's torch schedulers, and what each one's step count holds at a record."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.found: list[weakref.ref] = []
        self.searches_left = SEARCHES if optimizer is not None else 0

    def _search(self) -> None:
        if self.found or self.searches_left <= 0 or not _marked_by_a_scheduler(self.optimizer):
            return
        self.searches_left -= 1
        self.found = [weakref.ref(s) for s in gc.get_referrers(self.optimizer)
                      if isinstance(s, LRScheduler) and getattr(s, "optimizer", None) is self.optimizer]

    def evidence(self) -> Optional[list[dict]]:
        """Each live scheduler's class and step count (`last_epoch`) as plain numbers; None where none was found."""
        self._search()
        live = [s for s in (ref() for ref in self.found) if s is not None]
        if not live:
            return None
        return [_described(s) for s in live]


def _described(scheduler) -> dict:
    described = {"class": type(scheduler).__name__, "last_epoch": _plain(getattr(scheduler, "last_epoch", None))}
    schedule = _transformers_schedule(scheduler, described["last_epoch"]) or _torch_schedule(scheduler)
    return {**described, "schedule": schedule} if schedule else described


def _torch_schedule(scheduler) -> Optional[dict]:
    """The end of a torch scheduler whose formula ends (CosineAnnealingLR's T_max, PolynomialLR's total_iters), its
    first group's factor now (the rate it set over its base rate) and at the end (η_min over the base rate; a
    polynomial decays to 0); None for the others — LinearLR and ConstantLR hold their last factor by design,
    OneCycleLR refuses a step past its end, the warm-restart and step schedules have no end."""
    if isinstance(scheduler, CosineAnnealingLR):
        end, floor = scheduler.T_max, scheduler.eta_min
    elif isinstance(scheduler, PolynomialLR):
        end, floor = scheduler.total_iters, 0.0
    else:
        return None
    base = _plain((getattr(scheduler, "base_lrs", None) or [None])[0])
    rate = _plain(scheduler.optimizer.param_groups[0].get("lr"))
    if not base or rate is None:
        return None
    return {"function": type(scheduler).__name__, "warmup": None, "end": _plain(end), "factor_now": rate / base,
            "factor_at_end": _plain(floor) / base if _plain(floor) is not None else None}


def _transformers_schedule(scheduler, step: Optional[float]) -> Optional[dict]:
    """The lengths of a transformers schedule function behind a LambdaLR (its first group's) and its factor at the
    scheduler's step and at the schedule's end: `warmup` (num_warmup_steps), `end` (num_training_steps, or WSD's
    warm-up + stable + decay steps); None for any other scheduler."""
    lambdas = getattr(scheduler, "lr_lambdas", None) or [None]
    schedule = lambdas[0]
    if not (isinstance(schedule, functools.partial) and
            getattr(schedule.func, "__module__", "").startswith(SCHEDULE_MODULE)):
        return None
    keywords = schedule.keywords
    phases = [keywords.get(key) for key in ("num_warmup_steps", "num_stable_steps", "num_decay_steps")]
    end = keywords.get("num_training_steps")
    if end is None and all(_plain(value) is not None for value in phases):
        end = sum(phases)
    found = {"function": _public_name(schedule.func.__name__), "warmup": _plain(keywords.get("num_warmup_steps")),
             "end": _plain(end)}
    if found["end"] is not None and step is not None and step == int(step):
        found["factor_now"], found["factor_at_end"] = _factor(schedule, step), _factor(schedule, found["end"])
    return found


def _public_name(name: str) -> str:
    """The schedule function a user called, from the name of the lambda it returns
    (_get_cosine_schedule_with_warmup_lr_lambda → get_cosine_schedule_with_warmup)."""
    return name.strip("_").removesuffix("_lr_lambda").removesuffix("_lambda")


def _factor(schedule, step: float) -> Optional[float]:
    """The schedule's multiplier at a step; None where its arithmetic fails there (a polynomial decay of 0 steps)."""
    try:
        return _plain(schedule(int(step)))
    except (ArithmeticError, ValueError, TypeError):
        return None


def _marked_by_a_scheduler(optimizer) -> bool:
    return any("initial_lr" in group for group in getattr(optimizer, "param_groups", ()))


def _plain(value) -> Optional[float]:
    """A step count as a number for the record (a tensor or a numpy scalar read once; anything else: None)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
