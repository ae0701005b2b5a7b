"""tracing/stats.py: a tensor's statistics and the attention's entropy against numpy and float64 formulas."""

import numpy as np
import pytest
import torch
from helpers import numpy_stats

from blocktrace.tracing.stats import attention_chunk_stats, attention_stats, future_rows, tensor_stats


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


@pytest.mark.parametrize("rows, keys, start", [(5, 12, 0), (5, 12, 3), (5, 12, 7), (5, 12, 11), (4, 4, 0), (3, 9, 8),
                                                (6, 20, 2), (1, 1, 0), (2, 5, 6)])
def test_future_weight_of_a_chunk_matches_a_loop_over_every_key(rows, keys, start):
    """Each query row's weight on the keys after it, for a chunk starting anywhere (a last chunk, one row, keys
    ending inside the chunk or before it), against a plain loop over every (row, key)."""
    w = torch.rand(2, 3, rows, keys, generator=torch.Generator().manual_seed(rows * 100 + start))
    expected = torch.zeros(2, 3, rows)
    for row in range(rows):
        for key in range(keys):
            if key > start + row:
                expected[..., row] += w[..., row, key]
    assert torch.allclose(future_rows(w, start), expected, atol=1e-6)


@pytest.mark.parametrize("rows, keys, start", [(600, 700, 0), (300, 1000, 512), (257, 257, 0)])
def test_future_weight_of_a_chunk_longer_than_a_band_is_the_upper_triangles(rows, keys, start):
    """A chunk of more rows than FUTURE_BAND (one chunk of a whole matrix) is taken band by band: against the product
    with the whole mask."""
    w = torch.rand(1, 2, rows, keys, generator=torch.Generator().manual_seed(rows), dtype=torch.float64)
    expected = (w * torch.ones(rows, keys, dtype=torch.float64).triu_(start + 1)).sum(-1)
    assert torch.allclose(future_rows(w, start), expected, rtol=1e-12)


def test_future_weight_leaves_padded_query_rows_out():
    """With a query mask, a padded row's future weight counts for nothing; the rest as the loop sums it."""
    w = torch.rand(2, 3, 4, 10, generator=torch.Generator().manual_seed(5))
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 5:] = False  # the second sequence's queries 5.. are padding
    got = attention_chunk_stats(w, torch.log(w), slice(4, 8), mask)["future_weight_sum"]
    expected = sum(w[n, h, row, key].item() for n in range(2) for h in range(3) for row in range(4)
                   for key in range(10) if key > 4 + row and mask[n, 4 + row])
    assert got.item() == pytest.approx(expected, rel=1e-6)
