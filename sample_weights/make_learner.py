"""A learner's model and training loop, with the Watch in it, and the files they leave behind.

    python sample_weights/make_learner.py [OUTPUT_DIR]     # default: sample_weights/learner

The model is `learner/charmodel.py` (attention written by hand, an nn.Sequential MLP, forward(idx, targets)),
trained character by character on Python's textwrap.py source (the ids of make_nanogpt.py), 100 steps of AdamW
with a Watch every 10. It writes `watch.jsonl` (the healthy run's timeline), `ckpt.pt` (the last model as nanoGPT's
train.py saves one: {"model": state_dict, "model_args": ...}), and `betas-swapped.jsonl`: the same loop with
AdamW's betas given as (0.999, 0.9), a typo README's audit example finds from the optimizer's own settings.
"""

from __future__ import annotations

import sys
import textwrap
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "learner"))
sys.path.insert(0, str(HERE))
from charmodel import CharGPT  # noqa: E402
from make_nanogpt import encode  # noqa: E402

from blocktrace import Watch  # noqa: E402

SEED, STEPS, EVERY, BATCH, LR = 0, 100, 10, 8, 3e-3
ARGS = dict(vocab_size=96, n_embd=32, n_head=4, n_layer=2, block_size=32)
RUNS = {"watch.jsonl": (0.9, 0.999), "betas-swapped.jsonl": (0.999, 0.9)}  # AdamW's betas, as the loop gives them


def train(out: Path, timeline: str, betas: tuple) -> CharGPT:
    data = torch.from_numpy(encode(Path(textwrap.__file__).read_text(encoding="utf-8")).astype("int64"))
    torch.manual_seed(SEED)
    model = CharGPT(**ARGS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=betas)
    generator = torch.Generator().manual_seed(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the swapped run's Watch warns of its first error: the timeline holds it
        watch = Watch(model, out / timeline, every=EVERY, optimizer=optimizer, overwrite=True)
        for _ in range(STEPS + 1):
            starts = torch.randint(len(data) - ARGS["block_size"] - 1, (BATCH,), generator=generator)
            window = torch.stack([data[s : s + ARGS["block_size"] + 1] for s in starts.tolist()])
            _, loss = model(window[:, :-1], window[:, 1:].contiguous())  # the targets: the inputs advanced by one
            loss.backward()
            watch.step(loss)
            optimizer.step()
            optimizer.zero_grad()
        watch.close()
    return model


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for timeline, betas in RUNS.items():
        model = train(out, timeline, betas)
        if timeline == "watch.jsonl":
            torch.save({"model": model.state_dict(), "model_args": ARGS}, out / "ckpt.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "learner")
