"""Which rows of the token embedding the recorded step's gradient reached: rows the batch's tokens read, or only
others.

A lookup's gradient reaches exactly the rows its tokens read; a tied output head adds a gradient to every row (each
row's logit is in every softmax). A mask on the table's gradient (a hook keeping some rows frozen, PEFT's
trainable_token_indices) zeroes chosen rows. So some rows of the batch's tokens reached is every correct loop, and
none of them — while rows no token of the batch read are — is a gradient that skipped the batch it came from: a
mask inverted (`ids == k` where `ids != k` was meant), a hook on the wrong table. And where a head is tied to the table
and the loss normalises a softmax over the vocabulary, exactly 0 on every row no token read is the lookup's gradient
alone: the head's path to the matrix was cut (the matrix applied detached). Everything stays on the device until
the record's one copy.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from blocktrace.training.loss_facts import log_softmax_axes


def input_embedding(model: nn.Module) -> Optional[nn.Embedding]:
    """The table that embeds the model's token ids: HF's input embeddings, else its first nn.Embedding."""
    getter = getattr(model, "get_input_embeddings", None)
    embedding = getter() if callable(getter) else next((m for m in model.modules() if isinstance(m, nn.Embedding)),
                                                       None)
    return embedding if isinstance(embedding, nn.Embedding) else None


def input_vocabulary(model: nn.Module) -> Optional[int]:
    """How many ids the model embeds: HF's input embeddings, else its first nn.Embedding."""
    embedding = input_embedding(model)
    return embedding.num_embeddings if embedding is not None else None


def softmax_over_vocabulary(model: nn.Module, loss: Optional[torch.Tensor]) -> Optional[float]:
    """1 where the loss's autograd graph normalises a log-softmax over an axis as long as the model's vocabulary
    (next-token logits, whoever applied the head), 0 where it normalises none; None where the graph cannot say
    (no graph, no table)."""
    table = input_embedding(model)
    if table is None or not isinstance(loss, torch.Tensor) or loss.grad_fn is None:
        return None
    axes = log_softmax_axes(loss, table.num_embeddings).get("log_softmax_over")
    return None if axes is None else float(table.num_embeddings in axes)


@torch.no_grad()
def rows_reached(model: nn.Module, ids: Optional[torch.Tensor]) -> Optional[dict]:
    """The largest |gradient| on the rows the batch's ids read and on every other row, the least row maximum over
    the rows read (the padding row left out), how many rows no id read (device scalars), and whether a head is tied
    to the table (1 or 0); None without ids, a table, or a dense plain gradient on it (a sparse or sharded one is
    not read)."""
    table = input_embedding(model)
    grad = table.weight.grad if table is not None else None
    if ids is None or grad is None or type(grad) is not torch.Tensor or grad.layout is not torch.strided \
            or grad.dim() != 2 or ids.is_floating_point():
        return None
    per_row = grad.abs().amax(-1)
    # ids past the table would have failed the forward; clamped, so that a stray one cannot fail here
    index = ids.reshape(-1).to(grad.device).clamp(0, grad.shape[0] - 1)
    read = torch.zeros(grad.shape[0], dtype=torch.bool, device=grad.device).index_fill_(0, index, True)
    counted = read.clone()
    if table.padding_idx is not None:  # the padding row never gets a gradient from its lookups
        counted[table.padding_idx] = False
    return {"read_rows": torch.where(read, per_row, 0).amax(), "other_rows": torch.where(read, 0, per_row).amax(),
            "read_rows_least": torch.where(counted, per_row, float("inf")).amin(),
            "unread": (~read).sum(), "tied": float(tied_to_a_head(model, table))}


def tied_to_a_head(model: nn.Module, table: nn.Embedding) -> bool:
    """Whether the table's weight is also another module's (an output head tied to it: HF's tie_word_embeddings,
    nanoGPT's `wte.weight = lm_head.weight`)."""
    names = [name for name, p in model.named_parameters(remove_duplicate=False) if p is table.weight]
    return len(names) > 1
