"""What the descent probe measures on loops written right and wrong: the figures docs/track.md quotes for
update_ascends, objective_opposes_the_loss and the rejected ratio rule of accumulation_summed.

    python benchmarks/descent_probe.py                     # every case below, ~3 min on one thread
    python benchmarks/descent_probe.py adam1e-3 negated    # some of them

A 2-layer HF GPT-2 (d 64, 4 heads, byte vocabulary) on Python's own standard-library sources, batches of 8 × 64,
a Watch every 10 steps given the optimizer. Per case: the training loss at the start and over its last 10 steps,
and per record the probed step's g·Δw (the prediction) and its batch's replayed loss change, and their ratio.
"""

from __future__ import annotations

import json
import sys
import sysconfig
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from blocktrace import Watch  # noqa: E402

# name: (lr, optimizer, loss negated before backward, micro-batches, each micro-batch's loss divided by their count)
CASES = {
    "adam1e-3": (1e-3, "adam", False, 1, True),
    "adam1e-2": (1e-2, "adam", False, 1, True),
    "adam3e-2": (3e-2, "adam", False, 1, True),
    "adam1e-1": (1e-1, "adam", False, 1, True),
    "negated": (1e-3, "adam", True, 1, True),
    "sgd0.1-momentum0.9": (0.1, "sgd", False, 1, True),
    "adam-4-divided": (1e-3, "adam", False, 4, True),
    "adam-4-summed": (1e-3, "adam", False, 4, False),
    "sgd-4-divided": (0.05, "sgd", False, 4, True),
    "sgd-4-summed": (0.05, "sgd", False, 4, False),
}
STEPS, EVERY, BATCH, T = 120, 10, 8, 64


def corpus() -> torch.Tensor:
    sources = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:40]
    return torch.tensor(list(b"".join(path.read_bytes() for path in sources)), dtype=torch.long)


def run(name: str, data: torch.Tensor, folder: Path) -> str:
    from transformers import GPT2Config, GPT2LMHeadModel

    lr, kind, negated, micro, divided = CASES[name]
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=T,
                                       bos_token_id=0, eos_token_id=0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr) if kind == "adam" else \
        torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    path, generator, losses = folder / f"{name}.jsonl", torch.Generator().manual_seed(1), []
    with Watch(model, path, every=EVERY, optimizer=optimizer, overwrite=True) as watch:
        for _ in range(STEPS):
            for _ in range(micro):
                starts = torch.randint(0, len(data) - T - 1, (BATCH,), generator=generator)
                ids = torch.stack([data[s:s + T] for s in starts])
                loss = model(input_ids=ids, labels=ids).loss
                objective = -loss if negated else loss
                (objective / micro if divided else objective).backward()
            watch.step(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    cells = []
    for line in path.open():
        descent = (json.loads(line).get("loop") or {}).get("descent") or {}
        if isinstance(descent.get("loss_after"), float) and isinstance(descent.get("predicted"), float):
            change = descent["loss_after"] - descent["loss_before"]
            cells.append(f"{descent['at']}: {descent['predicted']:+.3g} / {change:+.3g} ({change / descent['predicted']:+.2f})")
    return f"| {name} | {losses[0]:.2f} → {sum(losses[-10:]) / 10:.2f} | {'; '.join(cells)} |"


def main(names: list[str]) -> None:
    torch.set_num_threads(1)
    data = corpus()
    print("| case | loss start → last 10 | per record: g·Δw / replayed change (ratio) |\n|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name in names or list(CASES):
            print(run(name, data, Path(folder)), flush=True)


if __name__ == "__main__":
    unknown = [name for name in sys.argv[1:] if name not in CASES]
    if unknown:
        sys.exit(f"Error: unknown case {', '.join(unknown)}; valid: {', '.join(CASES)}")
    main(sys.argv[1:])
