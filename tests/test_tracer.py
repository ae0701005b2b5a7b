"""tracing/tracer.py: one traced call — the tensors it keeps only when asked, the statistics of what it kept, the
values it samples."""

import pytest
import torch
from helpers import numpy_stats

from blocktrace.config import BlockConfig
from blocktrace.model.block import build_block
from blocktrace.tracing.tracer import trace


def test_trace_keeps_no_tensors_unless_asked():
    traced = trace(build_block(BlockConfig(d_model=8, n_heads=2)), torch.randn(4, 8))
    assert all(step.tensor is None for step in traced.steps) and traced.attention.tensor is None
    with pytest.raises(ValueError, match="keep_tensors=True"):
        traced.tensors()


def test_trace_stats_equal_stats_of_the_kept_tensors_and_samples_are_the_first_values():
    traced = trace(build_block(BlockConfig(d_model=8, n_heads=2)), torch.randn(2, 4, 8),
                   keep_tensors=True, sample_token=2, sample_size=3)
    for step in [traced.input, *traced.steps]:
        assert list(step.stats.to_dict().values()) == pytest.approx(numpy_stats(step.tensor.numpy()), rel=1e-5, abs=1e-6)
        assert step.sample == pytest.approx(step.tensor[0, 2, :3].tolist())
