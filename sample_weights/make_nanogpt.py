"""A hand-written nanoGPT training loop, as a user writes one, and the files it leaves behind.

    python sample_weights/make_nanogpt.py [OUTPUT_DIR]

nanoGPT's own model (tests/nanogpt.py, reproduced from Karpathy's model.py: nn.Linear
weights, bias=False, nn.GELU, the head tied to wte), trained character by character on
Python's textwrap.py source. What it writes is what such a loop writes: `val.bin` (uint16
ids, as nanoGPT's prepare.py writes them), `ckpt_0000.pt` … `ckpt_0200.pt` (train.py's
checkpoint dict: model, optimizer, model_args, iter_num, compiled with its `_orig_mod.`
prefix), and the last model once more through safetensors' `save_model` (`model.safetensors`,
which keeps the tied head and drops wte). Small on purpose (2 layers, d_model 32).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from nanogpt import GPT, GPTConfig, save_ckpt  # noqa: E402

SEED, STEPS, SAVE_AT, BATCH, LR = 0, 200, (0, 50, 100, 200), 8, 3e-3
CONFIG = GPTConfig(block_size=32, vocab_size=96, n_layer=2, n_head=4, n_embd=32, bias=False)


def encode(text: str) -> np.ndarray:
    """Printable ASCII as ids 1–95, anything else 0."""
    return np.array([ord(c) - 31 if 32 <= ord(c) < 127 else 0 for c in text], dtype=np.uint16)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = encode(Path(textwrap.__file__).read_text(encoding="utf-8"))
    split = int(len(data) * 0.9)
    train, val = data[:split], data[split:]
    val.tofile(out / "val.bin")
    torch.manual_seed(SEED)
    model = GPT(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(SEED)
    for step in range(STEPS + 1):
        if step in SAVE_AT:
            save_ckpt(model, out / f"ckpt_{step:04d}.pt", iter_num=step, compiled_prefix=True, optimizer=optimizer)
        starts = torch.randint(len(train) - CONFIG.block_size - 1, (BATCH,), generator=generator).tolist()
        x = torch.stack([torch.from_numpy(train[s : s + CONFIG.block_size].astype(np.int64)) for s in starts])
        y = torch.stack([torch.from_numpy(train[s + 1 : s + 1 + CONFIG.block_size].astype(np.int64)) for s in starts])
        _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    from safetensors.torch import save_model

    save_model(model, str(out / "model.safetensors"))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "nanogpt")
