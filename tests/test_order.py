"""training/order.py: an order of batches that repeats (a DistributedSampler never told its epoch) against orders
that do not (reshuffled every epoch, random windows), read from the two sums that key each step's batch."""

from __future__ import annotations

import torch

from blocktrace.training.order import DataOrder, batch_key


def _order_of(batches: list[torch.Tensor], record_every: int = 3):
    """What DataOrder finds over these batches, one per step, read at a record every few steps as the Watch does."""
    order, found = DataOrder(), None
    for step, ids in enumerate(batches):
        order.see(step, ids)
        order.see(step, ids + 1)  # a second forward in the step (accumulation): the step's batch is its first
        if step % record_every == 0 or step == len(batches) - 1:
            found = order.report(order.take()) or found
    return found


def _epochs(data: torch.Tensor, epochs: int, batch: int, reshuffle: bool) -> list[torch.Tensor]:
    """The batches of `epochs` passes over `data`, reshuffled at each one (set_epoch called) or in one order."""
    batches = []
    for epoch in range(epochs):
        order = torch.randperm(len(data), generator=torch.Generator().manual_seed(epoch if reshuffle else 0))
        batches += [data[order[i:i + batch]] for i in range(0, len(data), batch)]
    return batches


DATA = torch.randint(0, 256, (64, 16), generator=torch.Generator().manual_seed(1))


def test_an_order_repeated_every_epoch_is_found_with_its_period_and_start():
    found = _order_of(_epochs(DATA, 3, 4, reshuffle=False))  # 16 steps an epoch
    assert found == {"period": 16, "since": 16}  # epoch 1's first step: found ORDER_RUN steps into it


def test_a_short_epoch_repeated_is_found_once_the_whole_epoch_repeats():
    found = _order_of(_epochs(DATA[:12], 4, 4, reshuffle=False))  # 3 steps an epoch: fewer than ORDER_RUN
    assert found == {"period": 3, "since": 3}


def test_an_order_reshuffled_every_epoch_and_random_windows_are_not_a_repeated_order():
    assert _order_of(_epochs(DATA, 3, 4, reshuffle=True)) is None
    windows = torch.randint(0, 200, (40,), generator=torch.Generator().manual_seed(2))
    stream = torch.randint(0, 256, (400,), generator=torch.Generator().manual_seed(3))
    assert _order_of([stream[int(i):int(i) + 16].repeat(4, 1) for i in windows]) is None


def test_one_batch_met_again_is_not_a_repeated_order():
    batches = [DATA[i:i + 4] for i in range(0, 60, 4)]
    assert _order_of(batches + [batches[2]] + batches[5:9]) is None


def test_a_batchs_key_tells_a_reordering_of_the_same_ids():
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert batch_key(ids).tolist() == [21, 1 + 4 + 9 + 4 + 10 + 18]
    assert batch_key(ids.flip(-1)).tolist() != batch_key(ids).tolist()


def _repetition_of(batches: list[torch.Tensor], record_every: int = 3):
    order = DataOrder()
    for step, ids in enumerate(batches):
        order.see(step, ids)
        order.see(step, ids + 1)  # a later micro-batch of the step: not counted
        if step % record_every == 0 or step == len(batches) - 1:
            order.report(order.take())
    return order.repetition()


def test_sequences_trained_on_against_distinct_ones_match_a_count_of_the_ids_themselves():
    batches = _epochs(DATA, 5, 4, reshuffle=True) + [DATA[:4]]
    distinct = {tuple(row.tolist()) for ids in batches for row in ids}  # independent: the ids, not their keys
    assert _repetition_of(batches) == {"sequences": sum(len(ids) for ids in batches), "distinct": len(distinct)}
    assert len(distinct) == 64 and sum(len(ids) for ids in batches) == 5 * 64 + 4


def test_random_windows_of_a_corpus_are_almost_never_seen_twice():
    stream = torch.randint(0, 256, (100_000,), generator=torch.Generator().manual_seed(3))
    starts = torch.randint(0, 100_000 - 16, (200, 4), generator=torch.Generator().manual_seed(4))
    found = _repetition_of([torch.stack([stream[int(i):int(i) + 16] for i in row]) for row in starts])
    assert found["sequences"] == 800 and found["distinct"] >= 790
