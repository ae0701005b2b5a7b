"""The Watch where the training loop calls a part of the model (training/entry.py): the decoder `model.model`, the
head applied by the loop itself as F.linear(h, W) — blind11's F10 layout, where the Watch saw no batch at all — and
the tied head whose matrix the loop applied detached (tied_head_gradient_missing)."""

import pytest
import torch
import torch.nn.functional as F

from helpers import make_llama

from blocktrace import Watch
from blocktrace.training.timeline import read_timeline

VOCAB = 101


def _batch(step: int):
    generator = torch.Generator().manual_seed(500 + step)
    ids = torch.randint(0, VOCAB, (2, 13), generator=generator)
    return ids[:, :-1], ids[:, 1:]


def _logits(model, ids, head: str):
    """The loop's own forward: the decoder's hidden states, then the output matrix applied by hand."""
    h = model.model(input_ids=ids).last_hidden_state
    weight = model.get_output_embeddings().weight
    if head == "detached":
        weight = model.get_input_embeddings().weight.detach()  # F10's bug: the tied matrix's head gradient dropped
    return F.linear(h, weight)


def _train(tmp_path, head: str, steps: int = 4, every: int = 2) -> list[dict]:
    torch.manual_seed(0)
    model, _ = make_llama(True, tie_word_embeddings=True)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    path = tmp_path / f"{head}.jsonl"
    with Watch(model, path, every=every, optimizer=optimizer, overwrite=True) as watch:
        for step in range(steps):
            ids, targets = _batch(step)
            if head == "classifier":  # the backbone for another objective: a class per sequence, no vocabulary
                h = model.model(input_ids=ids).last_hidden_state.mean(1)
                loss = F.cross_entropy(h[:, :3], targets[:, 0] % 3)
            else:
                logits = _logits(model, ids, head)
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
            loss.backward()
            watch.step(loss)
            optimizer.step()
            optimizer.zero_grad()
    return read_timeline(path)


def _names(records: list[dict]) -> set[str]:
    return {flag["name"] for record in records for flag in record["flags"] if flag["level"] in ("warning", "error")}


def test_the_watch_reads_the_batch_where_the_loop_calls_the_decoder(tmp_path):
    """The loop never calls the model the Watch was given: its batch is read at the decoder (the record names it),
    and the embedding rows its gradient reached are measured."""
    records = _train(tmp_path, "tied")
    assert records and all(record["entry"] == "model" for record in records)
    assert all(record["data"] is not None for record in records)
    rows = records[-1]["loop"]["embedding_rows"]
    assert rows["tied"] == 1 and rows["softmax_over_vocabulary"] == 1
    assert rows["other_rows"] > 0 and rows["read_rows_least"] > 0  # the head's gradient reaches every row


def test_the_entry_stays_the_model_where_the_loop_calls_the_model(tmp_path):
    from helpers import watched_records

    records = watched_records(tmp_path / "run.jsonl")
    assert records and all(record.get("entry") is None for record in records)


@pytest.mark.parametrize("head", ["tied", "detached", "classifier"])
def test_a_tied_head_applied_detached_is_found_a_backbone_for_another_objective_is_not(tmp_path, head):
    """Detached: the matrix gets the lookup's gradient alone — every row the batch read, exactly 0 elsewhere — while
    the loss normalises a softmax over the vocabulary: gradient flow, at the second record. The head applied with
    the tied weight, and the backbone trained to classify (no softmax over the vocabulary), pass."""
    records = _train(tmp_path, head)
    found = [(record["step"], flag) for record in records for flag in record["flags"]
             if flag["name"] == "tied_head_gradient_missing"]
    if head != "detached":
        assert not found
        return
    assert [step for step, _ in found] == [2] and found[0][1]["level"] == "error"
    assert records[-1]["diagnosis"][0]["cause"] == "gradient_flow"


def test_a_forward_of_the_decoder_inside_the_model_does_not_move_the_entry(tmp_path):
    """Calling the model runs its decoder inside its own forward: the entry stays the model; an evaluation of the
    decoder under no_grad moves nothing either."""
    from blocktrace.training.entry import Entry

    model, _ = make_llama(True)
    moved = []
    entry = Entry(model, model.model.layers[0], lambda *a: None, lambda old, new, *a: moved.append(new))
    ids, _ = _batch(0)
    model(input_ids=ids)
    with torch.no_grad():
        model.model(input_ids=ids)
    assert entry.is_model and not moved
    model.model(input_ids=ids)
    assert entry.module is model.model and moved == [model.model] and entry.name == "model"
    entry.close()


class _Trunk(torch.nn.Module):
    """nanoGPT's body without its head: ids to the final hidden states."""

    def __init__(self, vocab: int, causal: bool, d: int = 16):
        super().__init__()
        from helpers import NanoBlock

        self.wte, self.wpe = torch.nn.Embedding(vocab, d), torch.nn.Embedding(32, d)
        self.h = torch.nn.ModuleList(NanoBlock(d, 2, causal) for _ in range(2))
        self.ln_f = torch.nn.LayerNorm(d)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class _Model(torch.nn.Module):
    def __init__(self, vocab: int, causal: bool):
        super().__init__()
        self.body = _Trunk(vocab, causal)

    def forward(self, ids):
        return self.body(ids) @ self.body.wte.weight.T


@pytest.mark.parametrize("causal", [True, False])
def test_the_causal_probe_runs_on_the_hidden_states_of_the_part_the_loop_calls(tmp_path, causal):
    """The loop calls the model's body and applies the head itself: the causal probe calls the body as the loop did
    and compares its hidden states — 0 where the attention is causal, a leak where it is not."""
    torch.manual_seed(0)
    model = _Model(VOCAB, causal)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Watch(model, tmp_path / "run.jsonl", every=2, optimizer=optimizer, overwrite=True) as watch:
        for step in range(3):
            ids, targets = _batch(step)
            logits = model.body(ids) @ model.body.wte.weight.T
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
            loss.backward()
            watch.step(loss)
            optimizer.step()
            optimizer.zero_grad()
    records = read_timeline(tmp_path / "run.jsonl")
    assert [r["entry"] for r in records] == ["body", "body"]
    leak = records[0]["probe"]["future_leak"]
    assert (leak < 1e-6) if causal else (leak > 0.01)
