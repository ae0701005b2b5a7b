"""The evaluated tokens against the ids trained on (training/coverage.py, evaluated_tokens_never_trained): a held-out
stream encoded otherwise than the training one (blind11's F06: a byte-level tokenizer's visible form trained on,
the raw text evaluated) is found; held-out batches of the training data's own distribution — a small vocabulary, or
a large Zipfian one whose rare ids a short run has not met yet — are not, and the Watch's own probes never count."""

import pytest
import torch

from helpers import NanoGPT

from blocktrace import Watch
from blocktrace.training.coverage import IdCoverage
from blocktrace.training.timeline import read_timeline


def test_coverage_counts_the_evaluated_tokens_no_training_batch_held():
    coverage = IdCoverage(10)
    coverage.evaluated(torch.tensor([[1, 2]]))  # before any training batch: not counted
    coverage.trained(torch.tensor([[1, 1, 2, 3]]))
    coverage.evaluated(torch.tensor([[1, 4, 5, 3]]))
    found = {key: int(value) for key, value in coverage.take().items()}
    assert found == {"trained_tokens": 4, "trained_once": 2, "evaluated_tokens": 4, "evaluated_unseen": 2}
    assert coverage.take() is None  # the evaluation counts start again at each record


def _ids(generator, weights, rows=3, tokens=13):
    return torch.multinomial(weights, rows * tokens, replacement=True, generator=generator).reshape(rows, tokens)


def _train(tmp_path, vocab: int, trained: torch.Tensor, evaluated: torch.Tensor, steps=21) -> list[dict]:
    """nanoGPT trained on ids drawn with weights `trained`, evaluated after each step on ids drawn with `evaluated`
    (in eval mode, under no_grad, as a loop's held-out loss is computed)."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(7)
    model = NanoGPT(vocab=vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Watch(model, tmp_path / "run.jsonl", every=5, optimizer=optimizer, overwrite=True) as watch:
        for _ in range(steps):
            batch = _ids(generator, trained)
            _, loss = model(batch[:, :-1], batch[:, 1:])
            loss.backward()
            watch.step(loss)
            optimizer.step()
            optimizer.zero_grad()
            model.eval()
            with torch.no_grad():
                held = _ids(generator, evaluated)
                model(held[:, :-1], held[:, 1:])
            model.train()
    return read_timeline(tmp_path / "run.jsonl")


def _flagged(records: list[dict]) -> list[int]:
    return [r["step"] for r in records for f in r["flags"] if f["name"] == "evaluated_tokens_never_trained"]


def test_a_held_out_stream_encoded_otherwise_is_the_data(tmp_path):
    """Training never holds ids 50-60 (as the visible form of a byte-level corpus has no raw space or newline);
    the held-out batches draw them: ~18% of their tokens unseen against Good's ~0% for the training sample."""
    vocab = 61
    trained, evaluated = torch.ones(vocab), torch.ones(vocab)
    trained[50:] = 0
    records = _train(tmp_path, vocab, trained, evaluated)
    coverage = records[-1]["data"]["coverage"]
    assert coverage["evaluated_unseen"] / coverage["evaluated_tokens"] > 0.1
    assert _flagged(records) == [10, 15, 20]
    found = next(f for f in records[2]["flags"] if f["name"] == "evaluated_tokens_never_trained")
    assert found["level"] == "error" and records[2]["diagnosis"][0]["cause"] == "data"


@pytest.mark.parametrize("vocab, zipf", [(61, False), (2000, True)], ids=["small-uniform", "large-zipf"])
def test_held_out_batches_of_the_training_distribution_pass(tmp_path, vocab, zipf):
    """The same distribution on both sides passes: a small vocabulary every id of which training soon holds, and a
    large Zipfian one whose rare ids neither side has met often (unseen at about Good's rate). The causal probe's
    changed ids, run without gradients at each record, are not counted as evaluated."""
    weights = 1 / torch.arange(1, vocab + 1, dtype=torch.float) if zipf else torch.ones(vocab)
    records = _train(tmp_path, vocab, weights, weights)
    assert not _flagged(records)
    coverage = records[-1]["data"]["coverage"]
    assert coverage["evaluated_tokens"] == 5 * 3 * 12  # the loop's five evaluations since the record before
    if zipf:
        share = coverage["evaluated_unseen"] / coverage["evaluated_tokens"]
        expected = coverage["trained_once"] / coverage["trained_tokens"]
        assert share > 0.02 and share < 3 * expected  # rare ids unseen on both sides, at Good's rate
