"""`check` asks a checkpoint which shift it learned: the loss with targets at shift 0, 1 and 2.

The reference is HF's own loss: a GPT-2 trained (by HF, offline, in the test) on counting sequences with its
labels given correctly, or shifted so that each position is trained on its own token, is read back by `check`.
"""

import json

import pytest
import torch
from torch.nn import functional as F

from blocktrace.diagnose.health import ModelEvidence, evaluate
from blocktrace.diagnose.loss import IGNORE, LossReport, shift_losses, shifted_labels

VOCAB, LENGTH, STEPS = 16, 12, 40


def counting(batch: int, seed: int) -> torch.Tensor:
    """Sequences that count up modulo V from a random start: the next token is always predictable."""
    starts = torch.randint(0, VOCAB, (batch, 1), generator=torch.Generator().manual_seed(seed))
    return (starts + torch.arange(LENGTH)) % VOCAB


def trained_gpt2(directory, copy: bool):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_head=2, n_layer=1, n_positions=LENGTH, vocab_size=VOCAB,
                                       bos_token_id=0, eos_token_id=0))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    for step in range(STEPS):
        ids = counting(16, step)
        # HF shifts inside: labels = ids trains token t + 1; labels delayed by one train each position on its own
        labels = torch.cat([torch.full((16, 1), IGNORE), ids[:, :-1]], 1) if copy else ids
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval().save_pretrained(directory)
    return model


def test_shifted_labels_equal_a_naive_loop():
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    mask = torch.tensor([[True, True, True, True, False]])
    for shift in (0, 1, 2):
        expected = [ids[0, t + shift].item() if t + shift < 5 and mask[0, t + shift] else IGNORE for t in range(5)]
        assert shifted_labels(ids, mask, shift)[0].tolist() == expected
    # every shift on the same positions: those with a token two ahead
    assert shifted_labels(ids, None, 0, last=3)[0].tolist() == [3, 4, 5, IGNORE, IGNORE]


def test_shift_losses_equal_cross_entropy_by_hand():
    logits = torch.randn(2, 6, 9, generator=torch.Generator().manual_seed(1))
    ids = torch.randint(0, 9, (2, 6), generator=torch.Generator().manual_seed(2))
    losses = shift_losses(logits, ids, None)
    for shift in (0, 1, 2):
        by_hand = F.cross_entropy(logits[:, :4].reshape(-1, 9), ids[:, shift:shift + 4].reshape(-1))
        assert losses[shift] == pytest.approx(by_hand.item(), rel=1e-6)
    assert shift_losses(logits[:, :2], ids[:, :2], None) is None  # no position has a token two ahead
    assert shift_losses(logits[:1, :6], ids[:1, :6], None) is None  # 4 positions: fewer than SHIFT_MIN_POSITIONS


def _flags(by_shift, step=None, uniform=2.77):
    loss = LossReport(by_shift[1], "next_token", 10, uniform, by_shift=by_shift)
    return [f.name for f in evaluate([], None, ModelEvidence(loss=loss, step=step))]


def test_the_rule_on_both_sides():
    assert "learned_wrong_shift" in _flags({0: 0.05, 1: 2.9, 2: 3.1})  # copies its input
    assert "learned_wrong_shift" in _flags({0: 3.0, 1: 2.9, 2: 0.2})  # predicts two ahead
    assert "learned_wrong_shift" not in _flags({0: 4.1, 1: 0.3, 2: 3.9})  # trained as it should be
    assert "learned_wrong_shift" not in _flags({0: 2.70, 1: 2.78, 2: 2.76})  # untrained: within the margin
    assert "learned_wrong_shift" not in _flags({0: 9.0, 1: 14.0, 2: 12.0})  # broken: no shift better than uniform
    assert "learned_wrong_shift" not in _flags({0: 0.05, 1: 2.9, 2: 3.1}, step=0)  # step 0 learned nothing
    # a healthy GPT-2 at step 10 (tied embeddings favour the input token from initialisation): not copying
    assert "learned_wrong_shift" not in _flags({0: 3.81, 1: 4.32, 2: 4.34}, step=10, uniform=4.57)


@pytest.mark.parametrize("copy", [True, False])
def test_check_names_a_checkpoint_trained_on_its_own_input(tmp_path, invoke, copy):
    model = trained_gpt2(tmp_path / "model", copy)  # a name with no step in it (tmp_path's ends in _0: step 0)
    ids = counting(1, 999)[0].tolist()
    result = invoke("check", "--weights", str(tmp_path / "model"), "--token-ids", *map(str, ids), "--json")
    report = json.loads(result.stdout)
    by_shift = {int(k): v for k, v in report["loss_detail"]["by_shift"].items()}
    with torch.no_grad():  # HF's own loss at shift 1, on the positions the probe uses
        logits = model(input_ids=torch.tensor([ids])).logits
    assert by_shift[1] == pytest.approx(F.cross_entropy(logits[0, :LENGTH - 2], torch.tensor(ids[1:LENGTH - 1])).item(),
                                        rel=1e-4, abs=1e-5)
    names = [f["name"] for f in report["flags"]]
    assert ("learned_wrong_shift" in names) == copy
    if copy:
        found = next(f for f in report["flags"] if f["name"] == "learned_wrong_shift")
        assert found["cause"] == "data" and "own input token" in found["detail"]
        assert result.exit_code == 1
