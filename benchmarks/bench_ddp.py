"""The Watch under DDP: its cost at every=50 and the collectives one record makes, at 2 and 4 gloo processes on CPU.

    python benchmarks/bench_ddp.py                  # 2 and 4 ranks; writes its section of RESULTS.md
    python benchmarks/bench_ddp.py --ranks 2        # a quick look (not written)

Each rank (one thread) trains an HF GPT-2-shaped model (2 layers, d_model 256, 4 heads, vocabulary 512, sdpa) under
DistributedDataParallel with AdamW on its own 4 × 256 random tokens. Windows of 50 steps are timed on rank 0, plain
and with `Watch(model, every=50, optimizer=…)` (one record per window), alternated, after a warm-up window of each;
the ratio is of the medians. The Watch's own collectives are counted during a recording step by wrapping
torch.distributed's all_reduce and all_gather (DDP's gradient all-reduce runs in its C++ reducer and is not among
them): their number and the bytes each rank sends.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import machine_facts, write_section  # noqa: E402

SECTION = "## The Watch under DDP: cost and collectives (2 and 4 gloo ranks, CPU)"
STEPS, EVERY, ROUNDS = int(os.environ.get("BENCH_STEPS", 50)), 50, int(os.environ.get("BENCH_ROUNDS", 3))
TOKENS, BATCH, VOCAB = 256, 4, 512


def _model():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=VOCAB, n_positions=TOKENS, bos_token_id=0,
                        eos_token_id=0, attn_implementation="sdpa")
    return GPT2LMHeadModel(config)


class Counted:
    """torch.distributed's all_reduce and all_gather, counted (calls, bytes sent by this rank) while active."""

    def __init__(self, dist):
        self.dist, self.calls, self.bytes, self.active = dist, 0, 0, False
        self.originals = {name: getattr(dist, name) for name in ("all_reduce", "all_gather")}
        for name, original in self.originals.items():
            setattr(dist, name, self._counting(original))

    def _counting(self, original):
        def call(*args, **kwargs):
            if self.active:
                tensor = args[1] if original is self.originals["all_gather"] else args[0]
                self.calls += 1
                self.bytes += tensor.numel() * tensor.element_size()
            return original(*args, **kwargs)
        return call


def _window(model, optimizer, batch, watch=None) -> float:
    start = time.perf_counter()
    for _ in range(STEPS):
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        if watch is not None:
            watch.step(loss)
        optimizer.step()
    return time.perf_counter() - start


def _rank(rank: int, world: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from blocktrace.training.watch import Watch

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    counted = Counted(dist)
    model = torch.nn.parallel.DistributedDataParallel(_model())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(0, VOCAB, (BATCH, TOKENS), generator=torch.Generator().manual_seed(rank))
    times: dict[str, list] = {"plain": [], "watched": []}
    with tempfile.TemporaryDirectory() as directory:
        for round_ in range(ROUNDS + 1):  # the first round warms up
            plain = _window(model, optimizer, batch)
            watch = Watch(model, f"{directory}/run-{round_}.jsonl", every=EVERY, optimizer=optimizer)
            counted.active, counted.calls, counted.bytes = True, 0, 0
            watched = _window(model, optimizer, batch, watch)
            counted.active = False
            watch.close()
            if round_:
                times["plain"].append(plain)
                times["watched"].append(watched)
        record_size = os.path.getsize(f"{directory}/run-{ROUNDS}.jsonl") if rank == 0 else 0  # rank 0 writes
    if rank == 0:
        Path(out).write_text(json.dumps({"times": times, "calls": counted.calls, "bytes": counted.bytes,
                                         "record_bytes": record_size}))
    dist.destroy_process_group()


def _forked(rank, world, port, out) -> None:
    try:
        _rank(rank, world, port, out)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def measure(world: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mktemp(suffix=".json")
    context = multiprocessing.get_context("fork")
    ranks = [context.Process(target=_forked, args=(rank, world, port, out)) for rank in range(world)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join()
    if any(process.exitcode for process in ranks):
        raise RuntimeError(f"a rank of {world} failed")
    result = json.loads(Path(out).read_text())
    os.unlink(out)
    return result


def row(world: int, result: dict) -> str:
    plain, watched = (statistics.median(result["times"][k]) for k in ("plain", "watched"))
    return (f"| {world} | {plain:.2f} s | {watched:.2f} s | {watched / plain:.3f} | {result['calls']} | "
            f"{result['bytes'] / 1024:.1f} KiB | {result['record_bytes'] / 1024:.1f} KiB |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", nargs="+", type=int, default=[2, 4])
    args = parser.parse_args()
    import torch  # noqa: F401  (imported once here, before the ranks fork)
    import transformers  # noqa: F401

    facts = machine_facts()
    rows = []
    for world in args.ranks:
        rows.append(row(world, measure(world)))
        print(rows[-1], flush=True)
    lines = [SECTION, "",
             f"Written by `python benchmarks/bench_ddp.py` on {facts['date']}: {facts['cpu']}, {os.cpu_count()} cores, "
             f"torch {facts['torch']}. Each rank one thread (4 ranks oversubscribe these cores: their times are "
             f"of a loaded machine); HF GPT-2-shaped, 2 layers, d_model 256, {BATCH} × {TOKENS} tokens per rank, "
             f"DDP over gloo, AdamW; windows of {STEPS} steps on rank 0, plain and with `Watch(every={EVERY}, "
             f"optimizer=…)` (one record), alternated, {ROUNDS} rounds after a warm-up round, medians. Collectives: "
             "the Watch's own all_reduce / all_gather calls during its window and the bytes each rank sends in them "
             "(DDP's gradient all-reduce is not counted). Target: ≤ 1.03× at every=50.", "",
             "| ranks | 50 plain steps | 50 steps with the Watch | ratio | Watch collectives per record | bytes sent "
             "per rank | timeline line |", "|---|---|---|---|---|---|---|", *rows, ""]
    print("\n".join(lines))
    if args.ranks == [2, 4]:
        write_section(SECTION, lines)


if __name__ == "__main__":
    main()
