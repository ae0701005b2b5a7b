"""training/distributed.py: the Watch under torch.distributed: two gloo processes on CPU record what one process
records on the concatenated batch, under DDP (every rank holds every weight) and under FSDP2 (each rank holds a
shard of each weight: norms, updates and gradient norms must cover every shard)."""

from __future__ import annotations

import math
import multiprocessing
import os
import socket
import traceback

import pytest
import torch
from helpers import NanoGPT, nano_batch

from blocktrace.training.timeline import read_timeline
from blocktrace.training.watch import Watch

STEPS, EVERY, BATCH = 3, 2, 4

def _rank(rank: int, directory: str, port: int) -> None:
    """One gloo rank: DDP, then FSDP2, each for STEPS steps on its share of the batch, recorded by a Watch."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank))
    torch.set_num_threads(1)  # a forked child does not reuse its parent's thread pool (as DataLoader workers)
    dist.init_process_group("gloo")
    size = dist.get_world_size()
    for wrapper in ("ddp", "fsdp2"):
        torch.manual_seed(0)
        model = NanoGPT()
        model.h[1].ln_2 = torch.nn.Linear(16, 16)  # a "norm" that does not normalise: the check must see it everywhere
        if wrapper == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model)
        else:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            from torch.distributed.tensor import DTensor

            mesh = init_device_mesh("cpu", (size,))
            for block in model.h:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            assert all(isinstance(p, DTensor) and p.to_local().numel() < p.numel() for p in model.h.parameters())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        watch = Watch(model, f"{directory}/{wrapper}.jsonl", every=EVERY)
        share = BATCH // size
        for step in range(STEPS):
            ids, targets = nano_batch(step, batch=BATCH)
            _, loss = model(ids[rank * share:(rank + 1) * share], targets[rank * share:(rank + 1) * share])
            optimizer.zero_grad()
            loss.backward()
            watch.step(loss)
            optimizer.step()
        watch.close()
    dist.destroy_process_group()


def _forked_rank(rank: int, directory: str, port: int) -> None:
    """In a forked child of this process (torch already imported: no second start-up per rank); never returns."""
    try:
        _rank(rank, directory, port)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_ranks(target, directory) -> None:
    """`target(rank, directory, port)` in two forked processes, a gloo group between them; both must succeed."""
    context, port = multiprocessing.get_context("fork"), _free_port()
    ranks = [context.Process(target=target, args=(rank, str(directory), port)) for rank in (0, 1)]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join(timeout=120)
        assert rank.exitcode == 0, f"a rank failed (exit code {rank.exitcode}); its traceback is on stderr above"


def _single_process(path):
    torch.manual_seed(0)
    model = NanoGPT()
    model.h[1].ln_2 = torch.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    watch = Watch(model, path, every=EVERY)
    for step in range(STEPS):
        ids, targets = nano_batch(step, batch=BATCH)
        _, loss = model(ids, targets)
        optimizer.zero_grad()
        loss.backward()
        watch.step(loss)
        optimizer.step()
    watch.close()
    return read_timeline(path)


@pytest.fixture(scope="module")
def timelines(tmp_path_factory) -> dict:
    """Two gloo ranks under DDP and then FSDP2, and one process on the whole batch: their timelines."""
    directory = tmp_path_factory.mktemp("distributed")
    _two_ranks(_forked_rank, directory)
    return {"ddp": read_timeline(directory / "ddp.jsonl"), "fsdp2": read_timeline(directory / "fsdp2.jsonl"),
            "one": _single_process(directory / "one.jsonl")}


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_two_ranks_record_what_one_process_records_on_the_whole_batch(timelines, wrapper):
    distributed, single = timelines[wrapper], timelines["one"]
    assert [r["step"] for r in distributed] == [r["step"] for r in single] == [0, 2]
    for ddp, one in zip(distributed, single):
        assert ddp["loss"] == pytest.approx(one["loss"], rel=1e-5)
        assert ddp["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
        for layer_ddp, layer_one in zip(ddp["layers"], one["layers"], strict=True):
            for name, stats in layer_one["steps"].items():
                for key in ("mean", "std", "min", "max", "rms", "absmax", "nan", "inf"):
                    assert layer_ddp["steps"][name][key] == pytest.approx(stats[key], rel=1e-5, abs=1e-6), (name, key)
            for key in ("max_logit", "future_weight_sum", "grad_norm"):
                assert layer_ddp[key] == pytest.approx(layer_one[key], rel=1e-4, abs=1e-6), key
            assert layer_ddp["entropy_per_head"] == pytest.approx(layer_one["entropy_per_head"], rel=1e-5)
            for kind, weights in layer_one["weights"].items():
                assert layer_ddp["weights"][kind]["norm"] == pytest.approx(weights["norm"], rel=1e-5)
                if weights["update_ratio"] is not None:
                    assert layer_ddp["weights"][kind]["update_ratio"] == pytest.approx(weights["update_ratio"], rel=1e-3)
        assert _errors(ddp) == _errors(one)
        assert ("norm_not_normalising", 1, "norm2") in _errors(ddp)
    assert distributed[0]["ranks"] == 2 and single[0]["ranks"] == 1
    assert all("rank 0's share of the batch (estimates)" in " ".join(layer["notes"]) for layer in distributed[0]["layers"])
    assert not any("estimates" in " ".join(layer["notes"]) for layer in single[0]["layers"])


def _errors(record: dict) -> set:
    return {(f["name"], f["layer"], f["step"]) for f in record["flags"] if f["level"] == "error"}


# --- the invariants of data parallelism, each on both sides -----------------------------------------------------

SCENARIOS = ("healthy", "clip-on-one-rank", "same-batch", "lr-on-one-rank", "hook-skips-all-reduce",
             "no-sync-accumulation", "no-causal-mask", "adam-healthy", "adam-state-changed-on-one-rank",
             "moved-after-wrapping", "step-apart-on-one-rank", "loss-scale-on-one-rank")
EPOCH_SCENARIOS = ("sampler-without-set-epoch", "sampler-with-set-epoch", "zero-sharded-state")
HSDP_SCENARIOS = ("hsdp-healthy", "hsdp-shard-changed-on-one-rank")
FSDP2_SCENARIOS = ("fsdp2-no-causal-mask",)
EPOCHS, SEQUENCES = 3, 16  # 16 sequences over 2 ranks, 2 a step: 4 steps an epoch


def _skip_all_reduce(state, bucket):
    """A DDP communication hook that returns the bucket as it is: no all-reduce, each rank keeps its own gradient."""
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def _scenario(name: str, rank: int, directory: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(NanoGPT(causal=name != "no-causal-mask"))
    if name == "hook-skips-all-reduce":
        model.register_comm_hook(None, _skip_all_reduce)
    if name == "moved-after-wrapping":  # cast after DDP built its buckets: the reducer no longer averages the
        model.module.double()  # gradients, silently (TrainCheck, OSDI'25: a model moved after wrapping)
    lr = 0.5 if name == "lr-on-one-rank" and rank == 1 else 0.05
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3) if name.startswith("adam") \
        else torch.optim.SGD(model.parameters(), lr=lr)
    start = EVERY if name == "step-apart-on-one-rank" and rank == 1 else None  # resumed from another checkpoint
    watch = Watch(model, f"{directory}/{name}.jsonl", every=EVERY, optimizer=optimizer, start=start)
    share = BATCH // 2
    for step in range(STEPS):
        ids, targets = nano_batch(step, batch=BATCH)
        mine = slice(0, share) if name == "same-batch" else slice(rank * share, (rank + 1) * share)
        optimizer.zero_grad()
        if name == "no-sync-accumulation":  # a micro-batch under no_sync, then the synchronised one
            with model.no_sync():
                model(ids[mine], targets[mine])[1].backward()
        _, loss = model(ids[mine], targets[mine])
        (loss * 4 if name == "loss-scale-on-one-rank" and rank == 1 else loss).backward()  # a scaler of its own
        watch.step(loss)
        if name == "clip-on-one-rank" and rank == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        optimizer.step()
        if name == "adam-state-changed-on-one-rank" and rank == 1 and step == 1:  # after the step: the weights still
            optimizer.state[model.module.ln_f.weight]["exp_avg_sq"].mul_(4)  # agree at the next record, the state not
    watch.close()


def _epoch_scenario(name: str, rank: int, directory: str) -> None:
    """Epochs over a dataset through a DistributedSampler (set_epoch called or not), or ZeRO's sharded optimizer
    state (ZeroRedundancyOptimizer: each rank steps its share of the parameters, then broadcasts them)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(NanoGPT())
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3) \
        if name == "zero-sharded-state" else torch.optim.SGD(model.parameters(), lr=0.05)
    ids, targets = nano_batch(0, batch=SEQUENCES)
    sampler = DistributedSampler(TensorDataset(ids, targets), seed=0)  # shuffle=True, its default
    loader = DataLoader(TensorDataset(ids, targets), batch_size=2, sampler=sampler)
    watch = Watch(model, f"{directory}/{name}.jsonl", every=EVERY, optimizer=optimizer)
    for epoch in range(EPOCHS):
        if name != "sampler-without-set-epoch":
            sampler.set_epoch(epoch)
        for batch, batch_targets in loader:
            optimizer.zero_grad()
            _, loss = model(batch, batch_targets)
            loss.backward()
            watch.step(loss)
            optimizer.step()
    watch.close()


def _hsdp_scenario(name: str, rank: int, directory: str) -> None:
    """FSDP2 over a 2 × 1 mesh (HSDP: every parameter replicated over the first dimension, sharded over the second),
    so both ranks hold the same shards; or one rank's shard of a norm changed after the first step, on that rank
    only (as clipping or a weight surgery run on one rank)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = NanoGPT(causal=not name.endswith("no-causal-mask"))
    mesh = init_device_mesh("cpu", (2,)) if name.startswith("fsdp2") else \
        init_device_mesh("cpu", (2, 1), mesh_dim_names=("replicate", "shard"))
    for block in model.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if name.startswith("hsdp"):
        assert [p.is_replicate() for p in model.h[0].ln_1.weight.placements] == [True, False]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    watch = Watch(model, f"{directory}/{name}.jsonl", every=EVERY, optimizer=optimizer)
    share = BATCH // 2
    for step in range(STEPS):
        ids, targets = nano_batch(step, batch=BATCH)
        optimizer.zero_grad()
        _, loss = model(ids[rank * share:(rank + 1) * share], targets[rank * share:(rank + 1) * share])
        loss.backward()
        watch.step(loss)
        optimizer.step()
        if name == "hsdp-shard-changed-on-one-rank" and rank == 1 and step == 0:
            with torch.no_grad():
                model.h[0].ln_1.weight.to_local().mul_(1.01)
    watch.close()


def _scenario_ranks(rank: int, directory: str, port: int) -> None:
    import torch.distributed as dist

    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank))
        torch.set_num_threads(1)
        dist.init_process_group("gloo")
        for name in SCENARIOS:
            _scenario(name, rank, directory)
        for name in EPOCH_SCENARIOS:
            _epoch_scenario(name, rank, directory)
        for name in HSDP_SCENARIOS:
            _hsdp_scenario(name, rank, directory)
        for name in FSDP2_SCENARIOS:
            _hsdp_scenario(name, rank, directory)
        dist.destroy_process_group()
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory) -> dict:
    directory = tmp_path_factory.mktemp("data-parallel")
    _two_ranks(_scenario_ranks, directory)
    return {name: read_timeline(directory / f"{name}.jsonl")
            for name in SCENARIOS + EPOCH_SCENARIOS + HSDP_SCENARIOS + FSDP2_SCENARIOS}


DATA_PARALLEL = {"replicas_differ", "gradients_not_averaged", "same_batch_on_ranks", "ranks_step_apart"}


@pytest.mark.parametrize("name, expected", [
    ("healthy", set()), ("no-sync-accumulation", set()),
    ("clip-on-one-rank", {"replicas_differ"}), ("same-batch", {"same_batch_on_ranks"}),
    ("lr-on-one-rank", {"ranks_step_apart", "replicas_differ"}),
    ("hook-skips-all-reduce", {"gradients_not_averaged", "replicas_differ"}),
    ("moved-after-wrapping", {"gradients_not_averaged", "replicas_differ"}),
    ("step-apart-on-one-rank", {"ranks_step_apart"}), ("loss-scale-on-one-rank", {"ranks_step_apart"}),
    ("adam-healthy", set()), ("adam-state-changed-on-one-rank", {"replicas_differ"}),
])
def test_the_invariants_of_data_parallelism(scenarios, name, expected):
    """Each broken loop found by its invariant (the first record already says what differs at step 0; weights part
    from the record after the step that split them), and the legitimate loops most like them pass."""
    found = {f["name"] for record in scenarios[name] for f in record["flags"] if f["level"] == "error"} & DATA_PARALLEL
    assert found == expected
    assert len(scenarios[name][0]["replicas"]) == 2


@pytest.mark.parametrize("name, said", [("lr-on-one-rank", "rank 1's learning rate is 0.5, rank 0's 0.05"),
                                        ("step-apart-on-one-rank", "rank 1's step is 2, rank 0's 0"),
                                        ("loss-scale-on-one-rank", "rank 1's loss scale is 4, rank 0's 1")])
def test_a_rank_that_steps_apart_is_named_with_what_differs(scenarios, name, said):
    details = [f["detail"] for f in scenarios[name][0]["flags"] if f["name"] == "ranks_step_apart"]
    assert details == [said]


def test_a_rank_whose_optimizer_state_parts_is_found_before_its_weights_do(scenarios):
    """Adam's moments changed on rank 1 after a step: at the next record its weights still equal rank 0's, its
    optimizer state does not (the invariant 'the same optimizer state where it is replicated')."""
    record = scenarios["adam-state-changed-on-one-rank"][1]
    rows = record["replicas"]
    assert rows[0]["weights_square"] == rows[1]["weights_square"] and rows[0]["state_held"] == rows[1]["state_held"] > 0
    said = next(f for f in record["flags"] if f["name"] == "replicas_differ")
    assert said["detail"].startswith("rank 1's optimizer state differs from rank 0's")
    zero = scenarios["zero-sharded-state"]  # ZeRO's state is the ranks' shards: not compared (its test below)
    assert not any(f["name"] == "replicas_differ" for r in zero for f in r["flags"])


def test_hsdp_replicated_shards_are_compared_within_their_replica_group(scenarios):
    """Issue 46: under HSDP the ranks of one replica group hold equal shards; a shard changed on one rank is found
    from the record after the change, named with the rank it should equal; the healthy twin passes."""
    healthy, changed = scenarios["hsdp-healthy"], scenarios["hsdp-shard-changed-on-one-rank"]
    assert all(row["replica_group"] == 0 for record in healthy for row in record["replicas"])
    assert not {f["name"] for r in healthy for f in r["flags"] if f["level"] == "error"} & DATA_PARALLEL
    assert [{f["name"] for f in r["flags"] if f["level"] == "error"} & DATA_PARALLEL for r in changed] == \
        [set(), {"replicas_differ"}]
    said = next(f for f in changed[1]["flags"] if f["name"] == "replicas_differ")
    assert said["detail"].startswith("rank 1's replicated shards differ from rank 0's")


def test_under_fsdp2_the_causal_probe_runs_on_every_rank_before_the_recording_forward(timelines, scenarios):
    """Issue 46: every rank probes alike before the training forward (FSDP2's forward is a collective; a forward
    between backward() and optimizer.step() would change what FSDP2 trains, one before the forward does not: the
    FSDP2 timeline records what one process records on the whole batch, test above). A causal model leaks nothing at
    every record; one without its mask is found at the first."""
    for record in timelines["fsdp2"]:
        assert record["probe"]["future_leak"] == pytest.approx(0.0, abs=1e-6) and record["probe"]["ranks_failed"] == 0
        assert record["probe"].get("note") is None
    leaked = scenarios["fsdp2-no-causal-mask"]
    assert leaked[0]["probe"]["future_leak"] > 1e-3
    assert "future_leak" in {f["name"] for f in leaked[0]["flags"] if f["level"] == "error"}


def test_fsdp2_shards_alone_are_no_replicas(timelines):
    """FSDP2 over one mesh dimension shards every parameter: no rank holds a replica of another's shard."""
    assert all(math.isnan(float(row["replica_group"])) for record in timelines["fsdp2"] for row in record["replicas"] or [])


def test_replica_groups_are_compared_apart():
    """Four ranks in two replica groups (0, 2) and (1, 3): shards differ between groups by design, not within."""
    from blocktrace.diagnose.invariants import _shards_apart

    rows = [{"replica_group": g, "shards_sum": s, "shards_square": s} for g, s in ((0, 1.0), (1, 2.0), (0, 1.0), (1, 2.0))]
    assert _shards_apart(rows) is None
    rows[3]["shards_square"] = 2.5
    assert _shards_apart(rows) == (3, 1)


def _serious(records: list[dict]) -> set:
    return {f["name"] for record in records for f in record["flags"] if f["level"] in ("error", "warning")}


def test_a_sampler_never_told_its_epoch_is_found_and_one_told_it_passes(scenarios):
    """Issue 46: DistributedSampler shuffles by the epoch set_epoch gives it; never given one, every epoch repeats
    the first one's order (4 steps an epoch here: found once the second epoch has repeated the whole first)."""
    repeated, told = scenarios["sampler-without-set-epoch"], scenarios["sampler-with-set-epoch"]
    assert _serious(repeated) - _serious(told) == {"data_order_repeats"} and "data_order_repeats" not in _serious(told)
    found = next(r for r in repeated if any(f["name"] == "data_order_repeats" for f in r["flags"]))
    assert found["step"] == 8 and found["data"]["order_repeats"] == {"period": 4, "since": 4}
    assert [f["level"] for f in found["flags"] if f["name"] == "data_order_repeats"] == ["warning"]


def test_zero_style_sharded_optimizer_state_is_a_legitimate_loop(scenarios):
    """ZeroRedundancyOptimizer shards AdamW's state over the ranks; the replicas still agree after each step, and
    nothing is raised that the same loop with a plain optimizer does not raise (the ranks' optimizer state differs
    by design: it is not compared)."""
    records = scenarios["zero-sharded-state"]  # its twin: the same epochs with SGD (the tiny model starts above
    assert _serious(records) == _serious(scenarios["sampler-with-set-epoch"])  # uniform guessing in both)
    assert len(records) == EPOCHS * 4 // EVERY
    assert all(len({row["weights_square"] for row in r["replicas"]}) == 1 for r in records)


def test_the_causal_probe_runs_under_ddp_on_every_rank(scenarios):
    """Each rank probes its own copy; rank 0 writes the largest leak over the ranks and how many could not run."""
    probe = scenarios["healthy"][0]["probe"]
    assert probe["future_leak"] == pytest.approx(0.0, abs=1e-6) and probe["ranks_failed"] == 0
    leaked = scenarios["no-causal-mask"]
    assert leaked[0]["probe"]["future_leak"] > 1e-3
    assert "future_leak" in {f["name"] for f in leaked[0]["flags"] if f["level"] == "error"}
