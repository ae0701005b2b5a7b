"""Shared fixtures: a CLI runner and GPT-2 checkpoints built offline by `transformers`."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from blocktrace.cli import cli

GPT2_TEST_CONFIG = dict(n_embd=32, n_head=4, n_layer=3, n_positions=64, vocab_size=101)


def randomise_(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random, biases and LayerNorm gains included, so no mapping error can hide."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                parameter.copy_(1.0 + 0.3 * noise)
            elif name.endswith("bias"):
                parameter.copy_(0.2 * noise)
            else:
                parameter.copy_(0.15 * noise)


def make_gpt2(head: bool, seed: int = 0, **overrides):
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

    config = GPT2Config(**{**GPT2_TEST_CONFIG, **overrides}, attn_implementation="eager")
    model = (GPT2LMHeadModel if head else GPT2Model)(config).eval()
    randomise_(model, seed)
    return model


@pytest.fixture(scope="session", params=["GPT2Model", "GPT2LMHeadModel"])
def gpt2_checkpoint(request, tmp_path_factory):
    """(directory, HF model) for both key layouts: `h.{k}.*` and `transformer.h.{k}.*`."""
    head = request.param == "GPT2LMHeadModel"
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
