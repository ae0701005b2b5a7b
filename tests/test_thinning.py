"""`track` over a long timeline (issue 45.7): the report keeps a bounded selection of the records and says so, while
the findings, the first and last sign, the rollback point and the notes are the ones judged over every record."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from blocktrace.cli import cli
from blocktrace.pipeline.track import track_request
from blocktrace.request import TrackRequest
from blocktrace.training import thinning
from blocktrace.training.thinning import Kept
from blocktrace.training.timeline import dumps, record
from blocktrace.vocab import Level

RECORDS = 100
SPIKE, JUMP = 60, 80  # the record whose loss spikes, the one whose learning rate jumps 100×
PARTED = 70  # from this record on, the run's residual stream is 10× the reference's
NOTED = range(30, 40)  # records whose causal probe could not run
BOUND = 8  # far below RECORDS: the report is thinned


def _entry(index: int, layers: list) -> dict:
    loss = 10.0 if index == SPIKE else 3.0 + (index % 5) / 100
    extra = {"probe": {"note": "the causal probe could not run"}} if index in NOTED else {}
    return record(10 * index, "watch", layers, [], [], loss=loss, lr=0.1 if index >= JUMP else 1e-3, extra=extra)


def _timeline(path, layers=lambda index: []):
    path.write_text("".join(dumps(_entry(index, layers(index))) + "\n" for index in range(RECORDS)), encoding="utf-8")
    return path


def _report(path, **fields):
    report, torn = track_request(TrackRequest(sources=(path,), fail_on=Level.ERROR, **fields))
    assert torn == []
    return report


@pytest.fixture
def both(tmp_path, monkeypatch):
    """The report of one long timeline unthinned (the bound above its length) and thinned (the bound lowered)."""
    path = _timeline(tmp_path / "run.jsonl")
    whole = _report(path)
    monkeypatch.setattr(thinning, "TRACK_POINTS", BOUND)
    return path, whole, _report(path)


def test_the_bound_keeps_every_kth_doubling_k_plus_the_marked_and_the_last():
    kept = Kept(4)
    for index in range(20):
        kept.add(index, keep=index == 5)
    # 0–3 held; at 4, five held: every 2nd (0, 2, 4); at 8, every 4th (0, 4, 8); at 16, every 8th (0, 8, 16)
    assert kept.items() == [0, 5, 8, 16, 19] and kept.every == 8 and kept.thinned


def test_a_thinned_report_has_the_findings_signs_and_rollback_of_every_record(both):
    _, whole, thinned = both
    assert "thinning" not in whole and len(whole["records"]) == RECORDS
    assert whole["first_sign"]["step"] == 10 * SPIKE and whole["first_sign"]["name"] == "loss_spike"
    assert whole["rollback"]["step"] == 10 * (SPIKE - 1)
    for key in ("first_sign", "last_flags", "rollback"):
        assert thinned[key] == whole[key]
    kept = {entry["step"]: entry for entry in thinned["records"]}
    raised = [entry for entry in whole["records"] if entry["new_flags"]]
    assert {10 * SPIKE, 10 * JUMP} <= {entry["step"] for entry in raised}
    for entry in raised:  # every record with a new finding is kept, with the same findings and diagnosis
        assert kept[entry["step"]] == entry
    assert {0, 10 * (SPIKE - 1), 10 * (RECORDS - 1)} <= set(kept)  # the first, the rollback point, the last
    assert len(kept) < RECORDS // 2


def test_a_thinned_report_says_so_in_json_and_text(both):
    path, whole, thinned = both
    said = thinned["thinning"]
    assert said["records_read"] == RECORDS and said["records_kept"] == len(thinned["records"])
    assert said["notes"] == [{"note": "the causal probe could not run", "records": len(NOTED),
                              "first_step": 10 * NOTED[0], "last_step": 10 * NOTED[-1]}]
    result = CliRunner().invoke(cli, ["track", str(path), "--json"])
    assert json.loads(result.output)["thinning"] == said
    text = CliRunner().invoke(cli, ["track", str(path), "--brief"]).output
    assert f"note: {said['records_kept']} of {RECORDS} records shown" in text
    assert f"{RECORDS} watch records" in text  # the header counts every record read, not the ones shown
    assert f"note: the causal probe could not run (at {len(NOTED)} records, steps {10 * NOTED[0]}–" \
           f"{10 * NOTED[-1]})" in text


def test_a_short_timeline_is_not_thinned_and_says_nothing_of_it(tmp_path):
    path = _timeline(tmp_path / "run.jsonl")
    report = _report(path)
    assert "thinning" not in report and [entry["step"] for entry in report["records"]] == \
        [10 * index for index in range(RECORDS)]
    text = CliRunner().invoke(cli, ["track", str(path), "--brief"]).output
    assert "records shown" not in text and f"{RECORDS} watch records" in text


def _layer(rms: float) -> list:
    return [{"layer": 0, "steps": {}, "rms": rms, "notes": []}]


def test_against_a_long_reference_parts_where_the_whole_comparison_does(tmp_path, monkeypatch):
    run = _timeline(tmp_path / "run.jsonl", lambda index: _layer(10.0 if index >= PARTED else 1.0))
    reference = _timeline(tmp_path / "reference.jsonl", lambda index: _layer(1.0))
    whole = _report(run, against=reference)["against"]
    monkeypatch.setattr(thinning, "TRACK_POINTS", BOUND)
    thinned = _report(run, against=reference)["against"]
    assert "thinning" not in whole and whole["matched"] == RECORDS
    assert whole["first_parted"]["step"] == 10 * PARTED  # both runs' losses spike alike: the rms parts them
    assert thinned["first_parted"] == whole["first_parted"] and thinned["matched"] == RECORDS
    assert thinned["thinning"]["steps_kept"] == len(thinned["steps"]) < RECORDS
    assert next(s for s in thinned["steps"] if s["step"] == 10 * PARTED) in whole["steps"]


def test_a_timeline_written_out_of_step_order_is_tracked_in_order_and_a_repeated_step_refused(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text("".join(dumps(_entry(index, [])) + "\n" for index in (2, 0, 1)), encoding="utf-8")
    assert [entry["step"] for entry in _report(path)["records"]] == [0, 10, 20]
    path.write_text("".join(dumps(_entry(index, [])) + "\n" for index in (0, 1, 1)), encoding="utf-8")
    result = CliRunner().invoke(cli, ["track", str(path)])
    assert result.exit_code == 2 and "run.jsonl:3 repeats step 10 of line 2" in result.output
