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


class _MaskDropped(torch.nn.Module):
    """A wrapper that takes the collator's attention_mask and never hands it on (the model attends to padding)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask=None, labels=None):
        return self.inner(input_ids=input_ids, labels=labels)


class _KeepAddedAttention(torch.nn.Module):
    """Causal attention that adds the 0/1 keep mask to the scores, as if it were an additive mask
    (scaled_dot_product_attention adds a float attn_mask): padding gets +0, text +1, nothing is masked."""

    def __init__(self, d, heads):
        super().__init__()
        self.c_attn, self.heads = torch.nn.Linear(d, 3 * d), heads

    def forward(self, x, attention_mask):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.c_attn(x).split(c, 2))
        causal = torch.full((t, t), float("-inf")).triu(1)
        keep = attention_mask[:, None, None, :].to(x.dtype)  # the bug: a keep mask used as an additive one
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=causal + keep)
        return y.transpose(1, 2).reshape(b, t, c)


class _KeepAddedBlock(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln_1, self.attn = torch.nn.LayerNorm(d), _KeepAddedAttention(d, heads)
        self.ln_2, self.mlp = torch.nn.LayerNorm(d), torch.nn.Linear(d, d)

    def forward(self, x, attention_mask):
        x = x + self.attn(self.ln_1(x), attention_mask)
        return x + self.mlp(self.ln_2(x))


class _AdditiveFromKeep(torch.nn.Module):
    """A hand-written causal LM of nanoGPT's layout whose attention adds the keep mask to its scores."""

    def __init__(self, vocab=50, d=16, heads=2):
        super().__init__()
        self.wte, self.lm_head = torch.nn.Embedding(vocab, d), torch.nn.Linear(d, vocab)
        self.h = torch.nn.ModuleList([_KeepAddedBlock(d, heads)])

    def forward(self, input_ids, attention_mask=None, labels=None):
        x = self.h[0](self.wte(input_ids), attention_mask)
        logits = self.lm_head(x)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 labels[:, 1:].reshape(-1), ignore_index=-100)
        return logits, loss


def _left_padded():
    ids = torch.randint(1, 50, (2, 12), generator=torch.Generator().manual_seed(3))
    ids[0, :4] = PAD
    mask = (ids != PAD).long()
    labels = ids.masked_fill(mask == 0, -100)
    return ids, mask, labels


def _probe_record(model, ids, mask, labels, tmp_path):
    from blocktrace import Watch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Watch(model, tmp_path / "run.jsonl", every=1, overwrite=True) as watch:
            output = model(input_ids=ids, attention_mask=mask, labels=labels)
            loss = output.loss if hasattr(output, "loss") else output[1]
            loss.backward()
            entry = watch.step(loss)
    assert entry is not None, watch.stopped
    return entry


def test_padding_a_model_attends_to_is_found_by_changing_it(tmp_path):
    """The probe's definition: positions the attention_mask drops must not change any kept position's logits."""
    ids, mask, labels = _left_padded()
    for model in (_MaskDropped(make_llama(head=True)[0]), _AdditiveFromKeep()):
        torch.manual_seed(0)
        entry = _probe_record(model.train(), ids, mask, labels, tmp_path)
        found = {f["name"]: f for f in entry["flags"]}
        assert entry["probe"]["padding_probed"] is True
        assert entry["probe"]["padding_leak"] > 1e-2, type(model).__name__
        assert found["padding_leak"]["level"] == "error" and found["padding_leak"]["cause"] == "mask"


def test_a_mask_applied_left_or_right_and_a_batch_without_padding_pass(tmp_path):
    ids, mask, labels = _left_padded()
    model = make_llama(head=True)[0].train()
    left = _probe_record(model, ids, mask, labels, tmp_path)
    assert left["probe"]["padding_probed"] is True and left["probe"]["padding_leak"] < 1e-6  # masked keys weigh 0
    assert "padding_leak" not in {f["name"] for f in left["flags"]}
    right, right_mask = _padded()
    entry = _probe_record(model, right, right_mask, right.masked_fill(right_mask == 0, -100), tmp_path)
    assert "padding_leak" not in {f["name"] for f in entry["flags"]}
    whole = _probe_record(model, ids, torch.ones_like(mask), ids, tmp_path)
    assert whole["probe"]["padding_probed"] is False and "padding_leak" not in {f["name"] for f in whole["flags"]}


def test_a_mask_that_drops_text_is_not_a_padding_mask_and_is_not_probed(tmp_path):
    """A hand-written loop's [B, T] mask over the prompt (several ids, not one pad id) is some other mask: the
    padding probe leaves it alone, whatever the model does with it."""
    ids, _, labels = _left_padded()
    ids[0, :4] = torch.tensor([5, 6, 7, 8])  # a prompt the mask drops: text, not padding
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    entry = _probe_record(_MaskDropped(make_llama(head=True)[0]).train(), ids, mask, labels, tmp_path)
    assert entry["probe"]["padding_probed"] is False
    assert "padding_leak" not in {f["name"] for f in entry["flags"]}


class _SequenceFirstAttention(torch.nn.Module):
    """nn.MultiheadAttention left at batch_first=False and given [B, T, E]: it reads B as the sequence, so each
    position attends to the same position of the other sequences (the causal mask built over that axis too)."""

    def __init__(self, d, heads, batch_first):
        super().__init__()
        self.mha = torch.nn.MultiheadAttention(d, heads, batch_first=batch_first)

    def forward(self, x):
        length = x.shape[1] if self.mha.batch_first else x.shape[0]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(length)
        return self.mha(x, x, x, attn_mask=mask, need_weights=False)[0]


class _MHABlock(torch.nn.Module):
    def __init__(self, d, heads, batch_first):
        super().__init__()
        self.ln_1, self.attn = torch.nn.LayerNorm(d), _SequenceFirstAttention(d, heads, batch_first)
        self.ln_2, self.mlp = torch.nn.LayerNorm(d), torch.nn.Linear(d, d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class _MHALanguageModel(torch.nn.Module):
    def __init__(self, batch_first, vocab=50, d=16, heads=2, batch_norm=False):
        super().__init__()
        self.wte, self.lm_head = torch.nn.Embedding(vocab, d), torch.nn.Linear(d, vocab)
        self.h = torch.nn.ModuleList([_MHABlock(d, heads, batch_first) for _ in range(2)])
        self.pooled = torch.nn.BatchNorm1d(d) if batch_norm else None  # pools the batch in training only

    def forward(self, ids, targets):
        x = self.wte(ids)
        for block in self.h:
            x = block(x)
        if self.pooled is not None:
            x = self.pooled(x.transpose(1, 2)).transpose(1, 2)
        logits = self.lm_head(x)
        return logits, torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _batch_record(model, tmp_path, batch=4):
    from blocktrace import Watch

    ids = torch.randint(0, 50, (batch, 10), generator=torch.Generator().manual_seed(4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Watch(model.train(), tmp_path / "run.jsonl", every=1, overwrite=True) as watch:
            _, loss = model(ids[:, :-1], ids[:, 1:])
            loss.backward()
            entry = watch.step(loss)
    assert entry is not None, watch.stopped
    return entry


def test_sequences_of_a_batch_that_attend_to_each_other_are_found(tmp_path):
    """The probe's definition: changing one sequence must not move another's logits. Found where
    nn.MultiheadAttention is given [B, T, E] without batch_first (the one-sequence causal probe cannot see it)."""
    torch.manual_seed(0)
    entry = _batch_record(_MHALanguageModel(batch_first=False), tmp_path)
    found = {f["name"]: f for f in entry["flags"]}
    assert entry["probe"]["batch_leak"] > 1e-2
    assert found["batch_leak"]["level"] == "error" and found["batch_leak"]["cause"] == "architecture"
    assert "future_leak" not in found  # each position sees only itself when the batch holds one sequence


def test_sequences_computed_alone_pass_batch_norm_included(tmp_path):
    for model in (_MHALanguageModel(batch_first=True), _MHALanguageModel(batch_first=True, batch_norm=True)):
        torch.manual_seed(0)
        entry = _batch_record(model, tmp_path)
        assert entry["probe"]["batch_leak"] < 1e-6  # each row's arithmetic is its own (0 here; rounding aside)
        assert "batch_leak" not in {f["name"] for f in entry["flags"]}
    one = _batch_record(_MHALanguageModel(batch_first=False), tmp_path, batch=1)
    assert one["probe"].get("batch_leak") is None  # one sequence: nothing to compare
