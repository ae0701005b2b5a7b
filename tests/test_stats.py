"""tracing/stats.py: a tensor's statistics and the attention's entropy against numpy and float64 formulas."""

import numpy as np
import pytest
import torch
from helpers import numpy_stats

from blocktrace.tracing.stats import attention_stats, tensor_stats


def test_tensor_stats_match_numpy():
    a = np.random.default_rng(0).normal(2.0, 3.0, size=(3, 7, 5)).astype(np.float32)
    assert tensor_stats(torch.from_numpy(a)) == pytest.approx(numpy_stats(a), rel=1e-5, abs=1e-6)


def test_nan_and_inf_are_counted():
    t = torch.tensor([1.0, float("nan"), float("inf"), float("-inf"), 2.0])
    values = tensor_stats(t)
    assert values[6:] == [1, 2]


def test_entropy_is_exact_for_peaked_and_extreme_logits():
    """The log-free entropy formula against −Σ p log p in float64, from uniform to collapsed rows."""

    for scale in (0.0, 1.0, 30.0, 1e4):
        scores = torch.randn(1, 2, 9, 9, generator=torch.Generator().manual_seed(3)) * scale
        weights = torch.softmax(scores, -1)
        expected = torch.special.entr(weights.double()).sum(-1).mean(dim=(0, 2))
        got = attention_stats(weights, scores)["entropy_per_head"]
        assert torch.allclose(got, expected, atol=2e-6 * max(1.0, scale)), scale
