"""`blocktrace track`: checkpoints in step order (and a Watch's timeline) against HuggingFace's own numbers
for the same checkpoints and tokens."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from click.testing import CliRunner
from helpers import SAMPLES

from blocktrace.cli import cli
from blocktrace.training.timeline import read_timeline

RUN = SAMPLES / "training" / "gpt2-lr-high"
EVAL = SAMPLES / "training" / "eval.txt"
STEPS = [0, 10, 25, 50, 100]


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def tracked():
    result = invoke("track", f"{RUN}/step_*", "--text-file", EVAL, "--grad", "--json")
    assert result.exit_code == 1, result.output  # this run fails: exit 1, as `check` does
    return json.loads(result.output)


def _hf_batch(path):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    rows = [tokenizer.encode(line).ids for line in EVAL.read_text().splitlines() if line]
    width = max(map(len, rows))
    ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    return ids, mask


def _hf(step):
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(RUN / f"step_{step:04d}", attn_implementation="eager").eval()


def test_each_row_is_huggingfaces_own_numbers_for_that_checkpoint(tracked):
    records = tracked["records"]
    assert [r["step"] for r in records] == STEPS
    for entry in records:
        model = _hf(entry["step"])
        ids, mask = _hf_batch(RUN / f"step_{entry['step']:04d}")
        labels = ids.masked_fill(mask == 0, -100)
        output = model(ids, attention_mask=mask, labels=labels, output_hidden_states=True, output_attentions=True)
        assert entry["loss"] == pytest.approx(output.loss.item(), rel=1e-5)
        real = mask.bool()
        for k, layer in enumerate(entry["layers"]):
            if k + 1 < len(entry["layers"]):  # HF's last hidden state has ln_f applied
                hidden = output.hidden_states[k + 1][real]
                assert layer["rms"] == pytest.approx(hidden.pow(2).mean().sqrt().item(), rel=1e-4)
            weights = output.attentions[k]  # [B, H, T, T]
            entropy = -(weights * torch.log(weights.clamp_min(1e-30))).sum(-1)  # [B, H, T]
            per_head = (entropy * real[:, None]).sum(dim=(0, 2)) / real.sum()
            assert layer["min_entropy"] == pytest.approx(per_head.min().item(), rel=1e-4, abs=1e-6)
        output.loss.backward()
        for k, block in enumerate(model.transformer.h):
            expected = torch.cat([p.grad.flatten() for p in block.parameters()]).norm().item()
            assert entry["layers"][k]["grad_norm"] == pytest.approx(expected, rel=1e-4)


def test_weight_movement_is_the_checkpoints_own_difference(tracked):
    from safetensors.torch import load_file

    kinds = {"attn_qkv": ("attn.c_attn.",), "attn_o": ("attn.c_proj.",), "ffn_w1": ("mlp.c_fc.",),
             "ffn_w2": ("mlp.c_proj.",), "norm": ("ln_1.", "ln_2.")}
    for before, now, entry in zip(STEPS, STEPS[1:], tracked["records"][1:]):
        old = load_file(RUN / f"step_{before:04d}" / "model.safetensors")
        new = load_file(RUN / f"step_{now:04d}" / "model.safetensors")
        for k, layer in enumerate(entry["layers"]):
            for kind, parts in kinds.items():
                names = [n for n in new if n.startswith(f"transformer.h.{k}.") and any(p in n for p in parts)]
                a = torch.cat([new[n].flatten().double() for n in names])
                b = torch.cat([old[n].flatten().double() for n in names])
                assert layer["weights"][kind]["norm"] == pytest.approx(a.norm().item(), rel=1e-6)
                assert layer["weights"][kind]["update_ratio"] == pytest.approx(((a - b).norm() / b.norm()).item(),
                                                                               rel=1e-6)
    assert all(w["update_ratio"] is None for w in tracked["records"][0]["layers"][0]["weights"].values())


def test_first_sign_is_the_first_error_over_the_records(tracked):
    firsts = [(r["step"], f) for r in tracked["records"] for f in r["flags"] if f["level"] == "error"]
    step, finding = firsts[0]
    assert tracked["first_sign"]["step"] == step and tracked["first_sign"]["name"] == finding["name"]
    assert tracked["first_sign"]["layer"] == finding["layer"]
    assert step > 0  # step 0 is the initialisation: healthy here


def test_a_file_that_is_neither_a_timeline_nor_a_checkpoint_is_said_to_be_so(tmp_path):
    notes = tmp_path / "README.md"
    notes.write_text("# notes\n")
    result = invoke("track", str(notes))
    assert result.exit_code == 2
    assert f"Error: {notes} is neither a timeline (a Watch's .jsonl, .ndjson file) nor a checkpoint" in result.output
    # what may hold weights is still read as a checkpoint, whatever its name: torch.save's zip, safetensors
    torch.save({"w": torch.zeros(2)}, tmp_path / "model")
    assert "is neither" not in invoke("track", str(tmp_path / "model")).output


def test_one_checkpoint_is_counted_as_one():
    result = invoke("track", f"{RUN}/step_0000", "--text-file", EVAL)
    assert result.output.splitlines()[0] == ("1 checkpoint of a 2-layer gpt2 model, the same 471 tokens through it "
                                             "(step 0)")


def test_the_table_ends_with_the_first_sign_of_trouble():
    result = invoke("track", f"{RUN}/step_*", "--text-file", EVAL)
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[0] == "5 checkpoints of a 2-layer gpt2 model, the same 471 tokens through each (steps 0–100)"
    assert lines[-3].startswith("first sign of trouble: step 10, layer 0, ")
    # layer 0's largest logit fell from 785 (step 50) to 670 (step 100): no longer growing, so judged as a Watch
    # judges it (test_track_judges_a_large_attention_logit_while_it_grows_...), and the hedge is said
    assert lines[-2] == "at the last step (100) no such finding remains: check that the loss recovered as well"
    assert lines[-1].startswith(f"roll back to: step 0 ({RUN / 'step_0000'})")
    assert any(line.startswith("most likely at step 10: learning rate") for line in lines)
    assert result.stderr_bytes in (None, b"")  # not a terminal: no progress bar


def test_a_healthy_checkpoint_exits_0_and_identical_weights_five_steps_apart_are_an_optimizer_that_never_stepped():
    start = RUN / "step_0000"  # the initialisation: healthy
    alone = invoke("track", start, "--steps", "0", "--text-file", EVAL)
    assert alone.exit_code == 0, alone.output
    assert alone.output.splitlines()[-1] == "no finding at error level or worse over 1 record (steps 0–0)"
    result = invoke("track", start, start, "--steps", "0,5", "--text-file", EVAL, "--json")
    report = json.loads(result.output)
    assert all(w["update_ratio"] == 0.0 for layer in report["records"][1]["layers"] for w in layer["weights"].values())
    assert result.exit_code == 1
    assert (report["first_sign"]["step"], report["first_sign"]["name"], report["first_sign"]["cause"]) == \
        (5, "no_update", "optimizer")


def test_checkpoints_are_ordered_by_step_not_by_argument(tmp_path):
    for step in (100, 20, 3):  # given out of order, and "step_100" sorts before "step_20" as text
        shutil.copytree(SAMPLES / "gpt2-tiny", tmp_path / f"step_{step}")
    result = invoke("track", tmp_path / "step_100", tmp_path / "step_20", tmp_path / "step_3", "--token-ids", "1 2 3",
                    "--json")
    assert [r["step"] for r in json.loads(result.output)["records"]] == [3, 20, 100]
    explicit = invoke("track", tmp_path / "step_100", tmp_path / "step_20", "--steps", "7,2", "--token-ids", "1 2",
                      "--json")
    assert [(r["step"], r["path"]) for r in json.loads(explicit.output)["records"]] == [
        (2, str(tmp_path / "step_20")), (7, str(tmp_path / "step_100"))]


def test_a_watch_timeline_is_tracked_as_checkpoints_are():
    result = invoke("track", RUN / "watch.jsonl", "--json")
    report = json.loads(result.output)
    raw = [json.loads(line) for line in (RUN / "watch.jsonl").read_text().splitlines()]
    assert [r["step"] for r in report["records"]] == [r["step"] for r in raw] == list(range(0, 100, 10))
    first = next((r["step"], f) for r in raw for f in r["flags"] if f["level"] == "error")
    assert (report["first_sign"]["step"], report["first_sign"]["name"]) == (first[0], first[1]["name"])
    assert result.exit_code == 1
    text = invoke("track", RUN / "watch.jsonl").output
    assert text.startswith("10 watch records, 2 blocks (steps 0–90)")
    brief = invoke("track", RUN / "watch.jsonl", "--brief").output.splitlines()
    # header, blank, table head, 10 rows, blank, diagnosis, advice, first sign, still there
    assert len(brief) == 2 + 2 + 10 + 1 + 5  # header, table, diagnosis, advice, first sign, still there, roll back
    assert brief[-1] == text.splitlines()[-1] and "per layer" not in "".join(brief)


def test_out_writes_the_timeline_track_reads_back(tmp_path, tracked):
    out = tmp_path / "series.jsonl"
    first = invoke("track", f"{RUN}/step_*", "--text-file", EVAL, "--grad", "--out", out)
    assert first.exit_code == 1
    records = read_timeline(out)
    assert [r["step"] for r in records] == STEPS and all(r["source"] == "checkpoint" for r in records)
    again = json.loads(invoke("track", out, "--json").output)
    assert again["first_sign"] == tracked["first_sign"]
    assert [r["layers"] for r in again["records"]] == [r["layers"] for r in tracked["records"]]
    refused = invoke("track", f"{RUN}/step_*", "--text-file", EVAL, "--out", out)
    assert refused.exit_code == 2 and "already exists: pass --force" in refused.output
    assert read_timeline(out) == records


def test_log_lines_up_the_training_log_by_step(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 10, "loss": 2.5, "lr": 0.001, "grad_norm": 0.7}\n{"epoch": 1}\n'
                   '{"step": 25, "loss": 2.25}\n')
    report = json.loads(invoke("track", f"{RUN}/step_*", "--text-file", EVAL, "--log", log, "--json").output)
    by_step = {r["step"]: r["log"] for r in report["records"]}
    assert by_step == {0: None, 10: {"loss": 2.5, "lr": 0.001, "grad_norm": 0.7}, 25: {"loss": 2.25}, 50: None,
                       100: None}
    table = invoke("track", f"{RUN}/step_*", "--text-file", EVAL, "--log", log).output
    assert "log loss" in table.splitlines()[2]


def test_the_progress_bar_goes_to_a_terminals_stderr_only(monkeypatch):
    import blocktrace.cli.track as track_cli

    monkeypatch.setattr(track_cli, "progress_wanted", lambda document, quiet=False: True)
    result = CliRunner().invoke(cli, ["track", f"{RUN}/step_00[01]*", "--text-file", str(EVAL)])
    assert "tracking" in result.stderr and "tracking" not in result.stdout
    monkeypatch.undo()
    assert track_cli.progress_wanted(document=False) is False  # pytest's streams are no terminal


@pytest.mark.parametrize("args, code, message", [
    ([], 2, "give the checkpoints to follow"),
    ([RUN / "step_0000"], 2, "checkpoints are compared on one input: give --token-ids, --token-ids-file, --text or --text-file"),
    ([RUN / "watch.jsonl", "--text", "x"], 2, "--text gives the input of the checkpoints: applies to checkpoints"),
    ([RUN / "watch.jsonl", "--grad"], 2, "--grad computes the checkpoints' gradients"),
    ([RUN / "watch.jsonl", RUN / "step_0000"], 2, "track reads one timeline, or checkpoints, not both"),
    ([RUN / "step_0000", RUN / "step_0010", "--steps", "1", "--token-ids", "1"], 2, "--steps gives 1 step(s) for 2"),
    ([RUN / "step_0000", RUN / "step_0010", "--steps", "4,4", "--token-ids", "1"], 2, "both hold step 4"),
    ([RUN / "step_0000", "--steps", "a", "--token-ids", "1"], 2, "is not a training step or a comma-separated list of them"),
    ([SAMPLES / "gpt2-tiny", "--token-ids", "1"], 2, "cannot tell the training step of"),
    ([SAMPLES / "no-such-run" / "step_*", "--token-ids", "1"], 2, "no checkpoint matches"),
    ([RUN / "watch.jsonl", "--json", "--format", "github"], 2, "--format shapes the tables"),
    ([RUN / "watch.jsonl", "--json", "--brief"], 2, "--brief shortens the tables; --json prints every record whole"),
    ([RUN / "watch.jsonl", "--log", RUN / "step_0000" / "config.json"], 2, "has no log_history list: --log takes JSON lines with a \"step\" key or HF Trainer's trainer_state.json"),
])
def test_bad_track_input_is_one_error_line(args, code, message):
    result = invoke("track", *args)
    assert result.exit_code == code, result.output
    assert result.output.startswith("Error: ") and message in result.output and "Traceback" not in result.output


def test_checkpoints_of_different_models_are_refused(tmp_path):
    shutil.copytree(SAMPLES / "gpt2-tiny", tmp_path / "step_1")
    shutil.copytree(SAMPLES / "llama-tiny", tmp_path / "step_2")
    result = invoke("track", tmp_path / "step_1", tmp_path / "step_2", "--token-ids", "1 2 3")
    assert result.exit_code == 2 and "track follows one model over training" in result.output


@pytest.mark.parametrize("change, named", [({"n_embd": 64}, "of different shapes"),
                                           ({"vocab_size": 99}, "wte.weight of different shapes")])
def test_checkpoints_of_another_width_or_vocabulary_are_refused(tmp_path, change, named):
    """Once: "2 checkpoints of a 2-layer gpt2 model" for two models of different widths and vocabularies."""
    from helpers import make_gpt2

    make_gpt2(head=True).save_pretrained(tmp_path / "step_1")
    make_gpt2(head=True, **change).save_pretrained(tmp_path / "step_2")
    result = invoke("track", tmp_path / "step_1", tmp_path / "step_2", "--token-ids", "1 2 3")
    assert result.exit_code == 2 and named in result.output and "another width or vocabulary" in result.output


def test_a_timeline_that_is_not_one_is_refused(tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text('{"step": 1}\n')
    result = invoke("track", other)
    assert result.exit_code == 2 and "is not a blocktrace timeline record" in result.output


def test_a_log_with_no_step_is_refused_and_a_cut_last_line_is_not(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text('{"epoch": 1, "loss": 2.0}\n')
    result = invoke("track", RUN / "watch.jsonl", "--log", log)
    assert result.exit_code == 2 and 'has no entry with an integer "step" and one of loss, lr, grad_norm' in result.output
    log.write_text('{"step": 10, "loss": 2.0}\n{"step": 20, "lo')  # the training run was killed mid-write
    report = json.loads(invoke("track", RUN / "watch.jsonl", "--log", log, "--json").output)
    assert [r["log"] for r in report["records"][:3]] == [None, {"loss": 2.0}, None]


def test_a_timeline_of_another_version_is_refused(tmp_path):
    line = (RUN / "watch.jsonl").read_text().splitlines()[0]
    newer = tmp_path / "newer.jsonl"
    newer.write_text(line.replace('"version": 1', '"version": 2') + "\n")
    result = invoke("track", newer)
    assert result.exit_code == 2 and "is timeline version 2; this blocktrace reads version 1" in result.output


def test_log_reads_hf_trainers_trainer_state_json(tmp_path):
    state = {"global_step": 50, "log_history": [
        {"epoch": 0.1, "grad_norm": 0.8, "learning_rate": 0.0005, "loss": 3.25, "step": 10},
        {"epoch": 0.5, "eval_loss": 3.0, "step": 50},
        {"epoch": 0.5, "grad_norm": 0.6, "learning_rate": 0.0004, "loss": 2.75, "step": 50}]}
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(state))
    report = json.loads(invoke("track", f"{RUN}/step_*", "--text-file", EVAL, "--log", path, "--json").output)
    by_step = {r["step"]: r["log"] for r in report["records"]}
    assert by_step[10] == {"loss": 3.25, "lr": 0.0005, "grad_norm": 0.8}
    assert by_step[50] == {"loss": 2.75, "lr": 0.0004, "grad_norm": 0.6} and by_step[0] is None


@pytest.mark.parametrize("args", [["compare", "--pre-ln", "--post-ln", "--layers", "2,3", "--grad"],
                                  ["check", "--weights", str(SAMPLES / "gpt2-tiny"), "--token-ids", "1", "2"]])
def test_long_commands_show_progress_on_a_terminal_only(monkeypatch, args):
    plain = CliRunner().invoke(cli, args)
    assert plain.stderr == ""  # pytest's streams are no terminal: nothing
    for module in ("blocktrace.cli.run", "blocktrace.cli.compare"):
        monkeypatch.setattr(f"{module}.progress_wanted", lambda document, quiet: not quiet)  # as on a terminal
    shown = CliRunner().invoke(cli, args)
    assert "/" in shown.stderr and ("depth 1/2" in shown.stderr or "layer 1/4" in shown.stderr)
    assert shown.stdout == plain.stdout
    assert CliRunner().invoke(cli, [*args, "--quiet"]).stderr == ""


def test_the_first_sign_and_the_diagnosis_name_the_same_cause(tmp_path):
    """Once: "most likely at step 0: initialisation", then "first sign of trouble: step 0 … (likely cause:
    learning rate)" — at step 0 no update has happened, so every finding's cause is the initialisation."""
    from safetensors.torch import load_file, save_file

    for step in (0, 10):
        target = tmp_path / f"step_{step:04d}"
        shutil.copytree(RUN / f"step_{step:04d}", target)
        tensors = load_file(target / "model.safetensors")
        save_file({k: v * 100 if ".attn.c_attn.weight" in k else v for k, v in tensors.items()},
                  target / "model.safetensors",
                  metadata={"format": "pt"})
    text = invoke("track", f"{tmp_path}/step_*", "--text-file", EVAL).stdout
    most_likely = next(line for line in text.splitlines() if line.startswith("most likely at step 0"))
    first = next(line for line in text.splitlines() if line.startswith("first sign of trouble: step 0"))
    assert "initialisation" in most_likely and "likely cause: initialisation" in first, text


def test_a_finding_that_escalates_is_new_at_its_new_level():
    """loss_above_uniform as info at step 10, an error at step 20: the first sign is the error at step 20, and step
    20's new findings name it (they listed only (name, layer) pairs never seen, so the escalation went unlisted)."""
    from blocktrace.training.track import first_sign, mark_new_flags
    from blocktrace.vocab import Level

    def record(step, level):
        return {"step": step, "flags": [{"name": "loss_above_uniform", "layer": None, "level": level}]}

    records = mark_new_flags([record(10, "info"), record(20, "error"), record(30, "error")])
    first = first_sign(records, Level.ERROR)
    assert first["step"] == 20
    assert [f["name"] for f in records[1]["new_flags"]] == [first["name"]]
    assert records[2]["new_flags"] == []  # still an error: nothing new


def test_track_goes_through_the_pipeline_like_every_command():
    """pipeline/track.py's track_request returns the report `track --json` prints: the CLI only parses, writes the
    outputs and renders (issue 34)."""
    from blocktrace.pipeline.track import track_request
    from blocktrace.request import TrackRequest
    from blocktrace.vocab import Level

    report, torn = track_request(TrackRequest(sources=(RUN / "watch.jsonl",), fail_on=Level.WARNING))
    printed = json.loads(invoke("track", RUN / "watch.jsonl", "--fail-on", "warning", "--json").output)
    assert torn == [] and json.loads(json.dumps(report)) == printed


def test_what_a_record_could_not_measure_is_printed_once_with_its_steps(tmp_path):
    """Issue 42.2: a probe that did not run, or attention that is not visible, is a note `track` prints — each
    distinct note once, with the steps it was made at — not only a null in the JSON."""
    from blocktrace.training.timeline import TimelineWriter, record

    path = tmp_path / "run.jsonl"
    writer = TimelineWriter(path)
    for step in (0, 10, 20):
        layers = [{"layer": i, "steps": {}, "rms": 1.0, "notes": ["attention weights are not visible: x"]}
                  for i in range(2)]
        writer.write(record(step, "watch", layers, [], [], loss=2.0,
                            extra={"probe": {"note": "causal probe not run: TypeError: y"} if step else {}}))
    writer.close()
    result = invoke("track", str(path))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "note: attention weights are not visible: x (at 3 records, steps 0–20)" in lines
    assert "note: causal probe not run: TypeError: y (at 2 records, steps 10–20)" in lines


def _sharpened(source, target, scale):
    """gpt2-tiny with every layer's query projection times `scale`: each attention logit times `scale`."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    tensors = load_file(target / "model.safetensors")
    for key, tensor in tensors.items():
        if key.endswith("attn.c_attn.weight"):  # Conv1D [d, 3d]: the first d columns make the queries
            tensor[:, :tensor.shape[0]] *= scale
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})


def test_track_judges_a_large_attention_logit_while_it_grows_from_checkpoint_to_checkpoint(tmp_path):
    """As the Watch does (test_health.py: ..._judged_while_it_grows), track hands each checkpoint the same layer's
    largest logit at the checkpoint before: a logit past 100 held flat is a sharp head the model learned, one that
    grows 1.5x is still growing; the first checkpoint, with nothing before it, is judged alone."""
    for step, scale in ((0, 40.0), (10, 40.0), (20, 60.0)):
        _sharpened(SAMPLES / "gpt2-tiny", tmp_path / f"step_{step}", scale)
    result = invoke("track", *(tmp_path / f"step_{s}" for s in (0, 10, 20)), "--token-ids", "1 2 3 4 5 6 7 8",
                    "--json")
    records = json.loads(result.output)["records"]
    logits = [max(layer["max_logit"] for layer in r["layers"]) for r in records]
    assert 100 < logits[0] == pytest.approx(logits[1]) and logits[2] < 1e4, logits
    growth = [{f["layer"] for f in r["flags"] if f["name"] == "attention_logit_growth"} for r in records]
    past_100 = [{layer["layer"] for layer in r["layers"] if layer["max_logit"] > 100} for r in records]
    assert growth[0] == past_100[0] and growth[0]  # alone: judged as `check` judges it
    assert growth[1] == set()  # held flat since the checkpoint before
    assert growth[2] == past_100[2] and growth[2]  # grown 1.5x
