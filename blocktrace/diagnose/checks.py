"""The checks' registry: every finding's name, threshold, source, meaning and cause, declared once.

diagnose.health declares the checks of traces, a model and its gradients, diagnose.dynamics those
of training over time, each with `@check` on the function that raises it; importing
blocktrace.diagnose imports both, so CHECKS is whole wherever it is read (the diagnosis, the
timeline reader, docs/check.md's table).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

from blocktrace.vocab import Choice, Level


class Cause(Choice):
    """What most likely went wrong: the fixed vocabulary of the diagnosis."""

    LEARNING_RATE = "learning_rate"
    INITIALISATION = "initialisation"
    WARMUP = "warmup"
    ARCHITECTURE = "architecture"
    PRECISION = "precision"
    MASK = "mask"
    RESIDUAL = "residual"
    NORM = "norm"
    DATA = "data"
    ROUTING = "routing"  # a mixture of experts' router: collapsed, starving experts, or logits grown too large
    OPTIMIZER = "optimizer"  # the optimizer misconfigured: not stepping, its updates vanishing, decay too strong
    GRADIENT_FLOW = "gradient_flow"  # parameters that require a gradient and never receive one (a detached graph)
    WEIGHTS = "weights"  # tensors corrupted or zeroed outside the optimizer (a loading or code bug)
    TRAINING_LOOP = "training_loop"  # the loop's order and modes: zero_grad, train()/eval(), backward before step
    LOSS_FUNCTION = "loss_function"  # the loss computes something else than the mean cross-entropy of its logits
    UNKNOWN = "unknown"  # the evidence shows that training fails but singles out no mechanism


class Scope(Choice):
    """What a check reads, and so when `evaluate` asks it (each check's function takes that evidence)."""

    STEP = "step"  # detect(record, layer, evidence): every traced step
    ATTENTION = "attention"  # detect(trace, layer): a traced layer's attention step
    ROUTING = "routing"  # detect(routing, layer): a mixture of experts' router, at the ffn step
    STACK = "stack"  # detect(traces, first_layer): the traced layers together
    MODEL = "model"  # detect(evidence): the loss, the weights, the optimizer's settings
    GRADIENTS = "gradients"  # detect(gradients, first_layer): --grad's step gradients
    TRAINING = "training"  # detect(history, entry): a timeline record against the ones before (dynamics.judge)


@dataclass(frozen=True)
class Check:
    name: str
    threshold: str
    source: str
    meaning: str
    cause: Cause
    # a symptom (the loss, an update spike) says that training fails, not why: the diagnosis files it under the
    # cause the other findings point to, and under its own only when nothing else was found
    symptom: bool = False
    advice: Optional[str] = None  # when this finding leads its cause, advice that fits it better than the cause's
    # the finding observes the fault itself (an invariant of every correct loop broken, or a probe of the property),
    # not a statistic the fault moves: the diagnosis ranks it first and never re-reads its cause from the context
    direct: bool = False
    # (scope, function) for each kind of evidence the check reads: most read one, the loss above uniform two
    detectors: tuple[tuple[Scope, Callable[..., list]], ...] = ()


CHECKS: dict[str, Check] = {}  # filled by the @check entries of diagnose.health and diagnose.dynamics


def check(scope: Scope, name: str, *entry, **extra):
    """A check is one entry: its name, threshold, source, meaning and cause, on the function that raises it. Given
    the name alone, the function is a second detector of a check declared before, for other evidence. The function
    returns Findings; the check names each one (its name is written here only) and gives it the check's cause
    unless the finding says another."""
    def register(detect: Callable[..., list]) -> Callable[..., list]:
        def named(*evidence) -> list[Flag]:
            found = detect(*evidence)
            if not found:
                return []  # most checks find nothing at most records: no list made to name nothing
            return [Flag(name, f.level, f.step, f.layer, f.value, f.detail, f.cause or CHECKS[name].cause)
                    for f in found]

        if entry or extra:
            CHECKS[name] = Check(name, *entry, **extra, detectors=((scope, named),))
        else:
            CHECKS[name] = dataclasses.replace(CHECKS[name], detectors=(*CHECKS[name].detectors, (scope, named)))
        return detect
    return register


# scope -> (the checks they were made from, its detectors): made again only when CHECKS changed (a check added,
# replaced or deleted, as tests do), since `track` asks at every record. The checks themselves are the key, held so
# that none is freed and its id reused: comparing them is one identity test each.
_DETECTORS: dict = {}


def detectors(scope: Scope) -> list[Callable[..., list]]:
    """The functions of every check that reads this scope's evidence, in the order the checks are declared."""
    checks = tuple(CHECKS.values())
    made = _DETECTORS.get(scope)
    if made is None or made[0] != checks:
        made = _DETECTORS[scope] = (checks, [detect for entry in checks for where, detect in entry.detectors
                                             if where is scope])
    return made[1]


@dataclass(frozen=True)
class Flag:
    name: str
    level: Level
    step: Optional[str]
    layer: Optional[int]
    value: float
    detail: str
    cause: Cause = Cause.UNKNOWN

    @staticmethod
    def readable(entry: dict) -> bool:
        """Whether a timeline's finding names a check (and a cause) this blocktrace knows."""
        return entry.get("name") in CHECKS and entry.get("cause") in (None, *Cause.values())

    @classmethod
    def from_entry(cls, entry: dict) -> "Flag":
        """A finding as a timeline holds it (its value is not kept there: NaN)."""
        return cls(entry["name"], Level(entry["level"]), entry.get("step"), entry.get("layer"), float("nan"),
                   entry.get("detail") or "", Cause(entry["cause"]) if entry.get("cause") else CHECKS[entry["name"]].cause)

    def to_dict(self) -> dict:
        check = CHECKS[self.name]
        return {"name": self.name, "level": self.level.value, "cause": self.cause.value, "step": self.step,
                "layer": self.layer, "value": self.value, "detail": self.detail, "threshold": check.threshold,
                "source": check.source, "meaning": check.meaning}


def flag(name: str, level: Level, step, layer, value: float, detail: str, cause: Optional[Cause] = None) -> Flag:
    """A finding of the check `name`, made outside its detector (a diagnosis's own tests, a timeline's replay)."""
    return Flag(name, level, step, layer, value, detail, cause or CHECKS[name].cause)


@dataclass(frozen=True)
class Finding:
    """What a check's detector returns: the check it belongs to names it (see `check`)."""

    level: Level
    step: Optional[str]
    layer: Optional[int]
    value: float
    detail: str
    cause: Optional[Cause] = None  # None: the check's own cause


def finding(level: Level, step, layer, value: float, detail: str, cause: Optional[Cause] = None) -> Finding:
    return Finding(level, step, layer, value, detail, cause)


def last_records(history, entry: dict, count: int) -> list[dict]:
    """The last `count` records, `entry` the last of them ([] while the history holds fewer): a check that must
    hold at that many records in a row."""
    recent = [*history[max(0, len(history) - (count - 1)):], entry]
    return recent if len(recent) == count else []
