"""The forward's other inputs, read by the Watch: position ids one value throughout, an attention mask inverted.

Each rule on both sides: the broken collator, and the legitimate loop most like it (position ids given as they
should be, packed documents restarting at 0, a correct padding mask, a batch with no padding)."""

import warnings

import torch

from helpers import make_llama

PAD = 0


def _names(position_ids=None, mask=None, ids=None, tmp_path=None):
    """The findings of one Watch record of a Llama (RoPE) forward given these inputs."""
    from blocktrace import Watch

    model = make_llama(head=True)[0].train()
    ids = ids if ids is not None else torch.randint(1, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    kwargs = {"input_ids": ids, "labels": ids}
    if position_ids is not None:
        kwargs["position_ids"] = position_ids
    if mask is not None:
        kwargs["attention_mask"] = mask
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the first-error warning: the record holds it
        with Watch(model, tmp_path / "run.jsonl", every=1, overwrite=True) as watch:
            loss = model(**kwargs).loss
            loss.backward()
            entry = watch.step(loss)
    assert entry is not None, watch.stopped
    return {flag["name"] for flag in entry["flags"] if flag["level"] in ("error", "warning")}


def test_position_ids_of_zeros_are_found(tmp_path):
    assert "position_ids_constant" in _names(position_ids=torch.zeros(2, 12, dtype=torch.long), tmp_path=tmp_path)


def test_position_ids_as_they_should_be_pass(tmp_path):
    assert "position_ids_constant" not in _names(position_ids=torch.arange(12).expand(2, 12), tmp_path=tmp_path)
    packed = torch.cat([torch.arange(5), torch.arange(7)]).expand(2, 12)  # two documents packed, each from 0
    assert "position_ids_constant" not in _names(position_ids=packed, tmp_path=tmp_path)


def _padded():
    ids = torch.randint(1, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    ids[0, 8:] = PAD
    ids[1, 10:] = PAD
    return ids, (ids != PAD).long()


def test_an_inverted_padding_mask_is_found(tmp_path):
    ids, mask = _padded()
    found = _names(mask=1 - mask, ids=ids, tmp_path=tmp_path)
    assert "attention_mask_inverted" in found


def test_a_correct_padding_mask_and_no_padding_pass(tmp_path):
    ids, mask = _padded()
    assert "attention_mask_inverted" not in _names(mask=mask, ids=ids, tmp_path=tmp_path)
    assert "attention_mask_inverted" not in _names(mask=torch.ones(2, 12, dtype=torch.long), tmp_path=tmp_path)
    assert "attention_mask_inverted" not in _names(mask=torch.ones(2, 12, dtype=torch.bool), tmp_path=tmp_path)
