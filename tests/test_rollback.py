"""The step to roll back to (training/rollback.py): the last healthy record before the first sign, from `track` and
from the Watch itself."""

from __future__ import annotations

import json
import warnings

import torch
from helpers import NanoGPT, nano_batch
from torch import nn

from blocktrace import Watch
from blocktrace.training.rollback import healthy, rollback_point

TWIN = "sample_weights/training/gpt2-twin-detached/watch.jsonl"


def _entry(step, *levels, loss=3.0):
    return {"step": step, "loss": loss, "path": f"ckpt_{step}", "flags": [{"name": "x", "level": level}
                                                                         for level in levels]}


def test_the_point_is_the_last_record_before_the_first_sign_that_raised_no_warning():
    records = [_entry(0), _entry(10, "info"), _entry(20, "warning"), _entry(30, "error"), _entry(40)]
    assert healthy(records[1]) and not healthy(records[2])
    assert rollback_point(records, 30) == {"step": 10, "path": "ckpt_10", "loss": 3.0}
    assert rollback_point(records, None) is None  # no trouble: nothing to roll back from
    assert rollback_point(records, 0) is None  # broken from the first record: nothing healthy to go back to


def test_track_names_the_step_on_a_real_run_cut_from_the_loss_at_step_50(invoke):
    """The twin run of the failure benchmark: block 0 detached from step 50 on; its records at 0–40 are clean."""
    result = invoke("track", TWIN, "--json")
    report = json.loads(result.stdout)
    assert report["first_sign"]["step"] == 50
    assert report["rollback"]["step"] == 40
    text = invoke("track", TWIN, "--brief").stdout
    assert "roll back to: step 40 (reload the last checkpoint saved at or before it)" in text


def test_track_over_checkpoints_names_the_checkpoint(invoke):
    result = invoke("track", "sample_weights/training/gpt2-lr-high/step_*", "--text-file", "sample_weights/training/eval.txt",
                    "--json")
    report = json.loads(result.stdout)
    first, point = report["first_sign"], report["rollback"]
    assert first is not None
    assert point is None or (point["step"] < first["step"] and point["path"].endswith(f"step_{point['step']:04d}"))


def test_the_watch_names_the_step_once_at_its_first_error(tmp_path):
    torch.manual_seed(0)
    model = NanoGPT()
    for embedding in (model.wte, model.wpe):
        nn.init.normal_(embedding.weight, std=0.02)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    watch = Watch(model, tmp_path / "run.jsonl", every=5, optimizer=optimizer)
    written = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(16):
            _, loss = model(*nano_batch(step))
            loss.backward()
            written.append(watch.step(loss))
            optimizer.step()
            if step < 7:  # from step 7 on the loop forgets zero_grad()
                optimizer.zero_grad()
        watch.close()
    records = [entry for entry in written if entry is not None]
    assert [r["step"] for r in records] == [0, 5, 10, 15]
    assert "gradients_not_zeroed" in {f["name"] for f in records[2]["flags"]}
    assert records[2]["rollback"] == 5 and "rollback" not in records[3]
    said = [str(w.message) for w in caught if "first error" in str(w.message)]
    assert len(said) == 1 and "step 10" in said[0] and "step 5" in said[0]
