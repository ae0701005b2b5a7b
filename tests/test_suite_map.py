"""Tests a newcomer can find: each module of blocktrace with logic has its test file, tests/test_<its name>.py (one
file for the modules of one name: test_track.py is the command's, from cli/ through pipeline/, training/ and
render/), or is listed below with the files that test it and how. A new module fails here until it has one or the
other; a listed module that gains its own file fails here until its entry goes."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import parsed_source

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

# module → (the test files that hold its tests, how they reach it)
TESTED_IN = {
    "cli/progress.py": (["test_track.py"], "the progress bar of a long track, on a terminal's stderr only"),
    "progress.py": (["test_track.py"], "the ticks a long command reports, through the bar above"),
    "diagnose/checks.py": (["test_health.py", "test_diagnosis.py"], "the registry: every entry's source, threshold, "
                           "cause and the findings it names"),
    "diagnose/loss.py": (["test_model.py", "test_shift_probe.py"], "the model's own loss, equal to HF's for every family"),
    "model/head.py": (["test_model.py"], "the final norm and output head, through the loss equal to HF's"),
    "model/init.py": (["test_compare.py"], "Xiong et al.'s initialisation, through their Lemma 2 and Theorem 1"),
    "model/stack.py": (["test_report.py", "test_compare.py"], "N blocks, each from its own seed"),
    "integrations.py": (["test_watch.py"], "the WatchCallback in HF's own Trainer"),
    "pipeline/blocks.py": (["test_run.py", "test_compare.py"], "run and compare through the CLI"),
    "pipeline/guard.py": (["test_sizing.py"], "the memory guard's refusals, before any allocation"),
    "render/documents/json_document.py": (["test_errors.py", "test_app.py"], "strict JSON (non-finite numbers as "
                                          "null, listed), and the document chosen by its flag"),
    "render/inspect.py": (["test_cli_weights.py"], "inspect's table"),
    "phrases.py": (["test_translate.py"], "every template said in the code, read back and said in Chinese"),
    "sources/inspect.py": (["test_cli_weights.py"], "inspect's document against the file's own tensors"),
    "sources/reading.py": (["test_hostile_inputs.py", "test_fuzz_files.py"], "every file read: size limits, "
                           "encodings, JSON that is not"),
    "sources/source.py": (["test_inputs.py", "test_run.py", "test_model.py"], "the block's input from each option"),
    "sources/tracefile.py": (["test_diff.py", "test_files.py"], "--save files written and compared"),
    "sources/training_step.py": (["test_torchfile.py", "test_track.py"], "a checkpoint's step from its file, its "
                                 "name or trainer_state.json"),
    "tracing/assembly.py": (["test_host.py"], "what the hooks saw, to Traces in one copy to the host"),
    "tracing/behaviour.py": (["test_hf_layers.py", "test_userblock.py"], "a block's causality and norm kinds, "
                             "measured"),
    "tracing/calling.py": (["test_hf_layers.py", "test_families.py"], "HF layers called as their models call them"),
    "tracing/records.py": (["test_tracer.py", "test_report.py"], "the typed results a trace returns"),
    "tracing/routing.py": (["test_moe.py"], "a router's load, importance and choices against HF's router"),
    "tracing/stack.py": (["test_report.py", "test_compare.py"], "blocks traced in turn, the stream over depth"),
    "tracing/steps.py": (["test_userblock.py", "test_hf_layers.py"], "where a block's steps live, found unnamed"),
    "tracing/tap.py": (["test_watch.py"], "a block inside someone else's forward, sdpa's attention"),
    "training/loop.py": (["test_invariants.py"], "what the Watch measures of the loop itself"),
    "training/between.py": (["test_invariants.py"], "the weights between two optimizer steps: a resume from an older "
                            "checkpoint, an average left swapped in, a decay written by hand"),
    "training/embedding_rows.py": (["test_invariants.py"], "the token embedding's rows the gradient reached: none "
                                   "that the batch read, while others trained, is a mask inverted"),
    "training/entry.py": (["test_watch_entry.py"], "the module the loop calls: the model, or the decoder it calls "
                          "instead (the head applied by the loop), where the batch is read"),
    "training/logit_gradient.py": (["test_invariants.py"], "the temperature a hard-label loss read the logits at, from its "
                             "gradient at them: tempered, plain, summed, z-loss, smoothed, distilled"),
    "training/stepping.py": (["test_audit.py"], "what the optimizer step after a record did: each group's largest "
                             "move per unit of learning rate, Adam's moments' agreement"),
    "model/mixer.py": (["test_lfm2.py", "test_qwen3_next.py", "test_granitemoehybrid.py"], "the three mixers "
                       "without attention weights built on it, each against HF with padding and unbatched inputs"),
    "model/short_conv.py": (["test_lfm2.py"], "LFM2's short convolution against HF's Lfm2ShortConv, its sub-steps and "
                            "padding"),
    "model/gated_delta.py": (["test_qwen3_next.py"], "the gated delta rule against HF's Qwen3NextGatedDeltaNet and a "
                             "token-by-token loop, its sub-steps and padding"),
    "model/mamba2.py": (["test_granitemoehybrid.py"], "Mamba-2's scan against HF's GraniteMoeHybridMambaLayer and a "
                        "token-by-token loop, its sub-steps and padding"),
    "training/arguments.py": (["test_watch.py", "test_watch_robust.py"], "the Watch's arguments refused by name, "
                              "step()'s loss and lr taken, start= and append= continuing a timeline"),
    "training/blocks.py": (["test_watch.py", "test_distributed.py"], "the blocks found inside wrappers, FSDP2's shards"),
    "training/batch.py": (["test_watch.py", "test_forward_inputs.py", "test_invariants.py"], "the recorded batch: "
                          "repeated, targets by name or position, shifted or not"),
    "training/probing.py": (["test_probes.py", "test_distributed.py"], "the causal probe in one process and across "
                            "ranks, refused under FSDP2"),
    "training/independence.py": (["test_forward_inputs.py", "test_probes.py"], "the causal, padding and batch "
                                 "probes: a leak, a mask not applied, sequences mixed, against HF's left and right "
                                 "padding and batch_first attention"),
    "training/judging.py": (["test_watch.py", "test_rollback.py"], "a record's flags and diagnosis, the rollback "
                            "warning at the first error"),
    "training/schedulers.py": (["test_audit.py"], "the schedulers driving the optimizer found without being handed to "
                               "the Watch: OneCycleLR, CosineAnnealingWarmRestarts, ReduceLROnPlateau"),
    "training/settings.py": (["test_host.py", "test_audit.py"], "eps as float16 and bfloat16 store it, computed on "
                             "the host; every audited hyperparameter of every param group"),
    "training/model_facts.py": (["test_audit.py", "test_invariants.py", "test_float16_scaling.py"], "the model's "
                                "embedding and head, dropouts, eval-mode modules, float16 forward"),
    "training/loss_facts.py": (["test_invariants.py"], "the loss against its logits: probabilities, the graph's "
                               "log-softmax, the cross-entropy range and mean"),
    "training/unheld.py": (["test_invariants.py"], "the parameters with a gradient that no optimizer in the process "
                           "holds"),
    "training/forward_call.py": (["test_probes.py", "test_invariants.py", "test_forward_inputs.py"], "the held "
                                 "forward call, its random state and its replay"),
    "training/tensorboard.py": (["test_watch.py"], "records as scalars in a SummaryWriter"),
    "training/schema.py": (["test_fuzz_files.py", "test_hostile_inputs.py"], "every field of a timeline record "
                           "replaced by anything"),
}


def _modules_with_logic() -> list[str]:
    """Every module with a function or method, but the families (one file each, tested together in test_families.py
    and test_modern_families.py) and the package entry points."""
    found = []
    for path in sorted((ROOT / "blocktrace").rglob("*.py")):
        relative = path.relative_to(ROOT / "blocktrace").as_posix()
        if path.name.startswith("_") or relative.startswith("sources/families/"):
            continue
        tree = parsed_source(path)
        if any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) for node in ast.walk(tree)):
            found.append(relative)
    return found


def test_every_module_with_logic_has_its_test_file_or_says_where_it_is_tested():
    unplaced = [module for module in _modules_with_logic()
                if not (TESTS / f"test_{Path(module).stem}.py").is_file() and module not in TESTED_IN]
    assert unplaced == []


def test_the_map_names_files_that_exist_and_no_module_that_has_its_own():
    for module, (files, how) in TESTED_IN.items():
        assert (ROOT / "blocktrace" / module).is_file(), module
        assert not (TESTS / f"test_{Path(module).stem}.py").is_file(), f"{module} has its own file now"
        assert files and how and all((TESTS / name).is_file() for name in files), module
