"""Shared fixtures: a CLI runner and GPT-2 checkpoints built offline by `transformers`."""

from __future__ import annotations

import gc
import os

import pytest
from click.testing import CliRunner
from hypothesis import settings

# Property tests: the same inputs on every CI run (CI is set there, as CI services set it), fresh ones on
# every local run, so a developer's runs keep searching; no example database either way.
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("local", database=None)
settings.load_profile("ci" if os.environ.get("CI") else "local")

# Under pytest-xdist (the README's `-n 2`), each worker computes on one thread: two workers with two threads each
# on two cores spend their time switching (measured once: 288 s against 100 s with OMP_NUM_THREADS=1).
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    torch.set_num_threads(1)

from blocktrace.cli import cli


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """The session is over (pytest's own last collection, which reports unraisable exceptions, has run): freeze
    what the process holds, so that the interpreter's exit does not traverse torch's and transformers' objects once
    more (~1.5 s per worker, waited for by the run)."""
    gc.freeze()


@pytest.fixture(scope="session", params=["GPT2Model", "GPT2LMHeadModel"])
def gpt2_checkpoint(request, tmp_path_factory):
    """(directory, HF model) for both key layouts: `h.{k}.*` and `transformer.h.{k}.*`."""
    head = request.param == "GPT2LMHeadModel"
    from helpers import make_gpt2  # torch: imported by the workers that run tests, not by xdist's coordinator

    model = make_gpt2(head)
    directory = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(directory)
    return directory, (model.transformer if head else model)


@pytest.fixture
def invoke():
    """Run the CLI in-process; returns click's Result (stdout, stderr, exit_code)."""
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(cli, list(args), catch_exceptions=False)

    return run
