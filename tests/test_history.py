"""The records before the one judged, in bounded memory (diagnose/history.py): what the checks read of them."""

from blocktrace.diagnose.dynamics import judge
from blocktrace.diagnose.history import HISTORY, History, learning_rates_before


def _record(step: int, lr: float) -> dict:
    return {"step": step, "lr": lr, "loss": 3.0, "layers": [], "flags": []}


def test_history_keeps_the_first_and_the_last_records_and_the_largest_lr_of_all():
    history = History()
    records = [_record(step, lr=1e-3 * (step + 1)) for step in range(100)]
    for entry in records[:50]:
        history.add(entry)
    assert len(history) == 1 + HISTORY
    assert history[0] is records[0] and list(history)[1:] == records[50 - HISTORY:50]
    assert learning_rates_before(history) == (50, records[49]["lr"])
    assert learning_rates_before(records[:50]) == learning_rates_before(history)  # a plain list: the same numbers


def test_a_warm_restart_to_an_earlier_peak_is_not_an_lr_jump_however_long_the_decay():
    """SGDR's restart returns to the peak after a decay longer than the kept window: judged against the largest
    learning rate of every record before, not of the window's (where the restart would be a 1000× jump)."""
    history = History()
    for step in range(60):
        history.add(_record(step * 10, lr=1e-3 if step < 3 else 1e-6))
    assert not [f for f in judge(history, _record(600, lr=1e-3)) if f.name == "lr_jump"]
    assert [f for f in judge(history, _record(600, lr=2e-2)) if f.name == "lr_jump"]  # 20× the peak: a jump
