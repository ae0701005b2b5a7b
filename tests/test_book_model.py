"""The GPT of "Build a Large Language Model (From Scratch)" (tests/book_gpt.py) under the Watch as the book writes
it: its blocks found in their nn.Sequential without blocks=, their steps named by the book's module names, its
hand-written attention's weights seen, and its causal mask probed — on both sides (the mask left out)."""

import warnings

import torch
import torch.nn.functional as F
from book_gpt import SMALL, GPTModel

from blocktrace import Watch
from blocktrace.training.blocks import find_blocks

SIX = ["norm1", "attn", "residual1", "norm2", "ffn", "residual2"]


def _book_loop(path, cfg=SMALL, steps=2, attention=None):
    """chapter 5's train_model_simple: logits from the model, the loss the loop's, AdamW(lr 4e-4, wd 0.1); each
    block's attention replaced by attention(cfg) where given."""
    torch.manual_seed(123)
    model = GPTModel(cfg)
    for block in model.trf_blocks if attention else ():
        block.att = attention(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-4, weight_decay=0.1)
    records = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Watch(model, path, every=1, optimizer=optimizer, overwrite=True) as watch:
            for step in range(steps):
                ids = torch.randint(0, cfg["vocab_size"], (4, 13), generator=torch.Generator().manual_seed(step))
                inputs, targets = ids[:, :-1], ids[:, 1:]
                optimizer.zero_grad()
                logits = model(inputs)
                loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
                loss.backward()
                records.append(watch.step(loss))
                optimizer.step()
    return model, records


def test_the_books_blocks_are_found_in_their_sequential_and_traced_step_by_step(tmp_path):
    model, records = _book_loop(tmp_path / "run.jsonl")
    assert find_blocks(model) == list(model.trf_blocks)
    layers = records[-1]["layers"]
    assert len(layers) == SMALL["n_layers"]
    assert list(layers[0]["steps"]) == SIX
    assert layers[0]["future_weight_sum"] == 0.0  # its triu mask, read off its own softmax's weights
    assert records[-1]["probe"]["future_leak"] < 1e-6
    assert not [f for r in records for f in r["flags"] if f["level"] == "error"]


def test_the_book_model_without_its_mask_is_found_leaking(tmp_path):
    _, records = _book_loop(tmp_path / "run.jsonl", cfg={**SMALL, "masked": False})
    found = {f["name"]: f for f in records[0]["flags"] if f["level"] == "error"}
    assert {"future_leak", "causal_leak"} & set(found)
    assert records[0]["diagnosis"][0]["cause"] == "mask"


class BareProjections(torch.nn.Module):
    """The book's chapter-3 SelfAttention_v1 written multi-head: W_query/W_key/W_value bare [d_in, d_out] parameters
    used as `x @ W`, drawn by `draw` (the book's torch.rand, or a centred draw), and an nn.Linear out_proj."""

    def __init__(self, cfg, draw):
        super().__init__()
        d, self.heads = cfg["emb_dim"], cfg["n_heads"]
        self.W_query, self.W_key, self.W_value = (torch.nn.Parameter(draw(d, d)) for _ in range(3))
        self.out_proj = torch.nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = ((x @ w).view(b, t, self.heads, -1).transpose(1, 2) for w in (self.W_query, self.W_key, self.W_value))
        return self.out_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))


def test_bare_projections_drawn_from_torch_rand_are_off_centre_and_centred_ones_pass(tmp_path):
    """A hand-written `x @ W` with W = nn.Parameter(torch.rand(d_in, d_out)) (U[0, 1): mean/std = √3) is read as a
    weight matrix of the block, as nn.Linear's weight is; W = torch.randn(d_in, d_out)/√d_in passes."""
    _, bad = _book_loop(tmp_path / "rand.jsonl", attention=lambda cfg: BareProjections(cfg, torch.rand))
    found = [f for f in bad[0]["flags"] if f["name"] == "weights_off_centre"]
    assert found and found[0]["level"] == "error" and found[0]["cause"] == "initialisation"
    assert "att.W_" in found[0]["detail"]
    assert bad[0]["diagnosis"][0]["cause"] == "initialisation"
    _, good = _book_loop(tmp_path / "randn.jsonl",
                         attention=lambda cfg: BareProjections(cfg, lambda i, o: torch.randn(i, o) / i ** 0.5))
    assert not [f for r in good for f in r["flags"] if f["level"] in ("error", "warning")]
