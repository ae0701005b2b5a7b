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


def _labels_of(ids, mask, counted_pads: int):
    """HF labels (the model shifts them): the text, the first `counted_pads` padded positions of each sequence kept
    as targets, the rest -100."""
    labels = ids.clone()
    for row in range(ids.shape[0]):
        dropped = (mask[row] == 0).nonzero().flatten()
        labels[row, dropped[counted_pads:]] = -100
    return labels


def _padding_names(labels, ids, mask, tmp_path):
    from blocktrace import Watch

    model = make_llama(head=True)[0].train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Watch(model, tmp_path / "run.jsonl", every=1, overwrite=True) as watch:
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            entry = watch.step(loss)
    assert entry is not None, watch.stopped
    return {flag["name"]: flag for flag in entry["flags"] if flag["level"] in ("error", "warning")}


def test_padding_counted_by_the_loss_is_found(tmp_path):
    ids, mask = _padded()
    found = _padding_names(ids.clone(), ids, mask, tmp_path)  # labels = input_ids: every pad a target
    assert "padding_counted" in found
    assert "counts 4 targets" in found["padding_counted"]["detail"]  # the first sequence's 4 pads, counted by hand
    assert found["padding_counted"]["cause"] == "data"


def test_padding_as_the_ignore_index_or_one_end_of_text_target_passes(tmp_path):
    ids, mask = _padded()
    assert "padding_counted" not in _padding_names(_labels_of(ids, mask, 0), ids, mask, tmp_path)
    assert "padding_counted" not in _padding_names(_labels_of(ids, mask, 1), ids, mask, tmp_path)  # pad = eos kept
    assert "padding_counted" in _padding_names(_labels_of(ids, mask, 2), ids, mask, tmp_path)
    no_padding = torch.ones(2, 12, dtype=torch.long)
    assert "padding_counted" not in _padding_names(ids.clone(), ids, no_padding, tmp_path)


def test_an_inverted_mask_is_said_once_not_as_padding_counted(tmp_path):
    ids, mask = _padded()
    found = _padding_names(ids.clone(), ids, 1 - mask, tmp_path)
    assert "attention_mask_inverted" in found and "padding_counted" not in found


def test_left_padding_is_counted_as_hfs_shifted_loss_counts_it(tmp_path):
    """HF shifts its labels: the label at position 0 is never a target, so two left pads counted are one pad
    target (passes, as the end-of-text one would), three are two (found)."""
    ids = torch.randint(1, 50, (2, 12), generator=torch.Generator().manual_seed(2))
    for pads, found in ((2, False), (3, True)):
        padded = ids.clone()
        padded[0, :pads] = PAD
        mask = (padded != PAD).long()
        assert ("padding_counted" in _padding_names(padded.clone(), padded, mask, tmp_path)) is found
