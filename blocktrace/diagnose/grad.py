"""Gradients: of a checkpoint's own loss (its head and labels), or, for seeded blocks at
initialisation, of the loss of Xiong et al. 2020.

Xiong's loss: the stack's output (after a parameter-free LayerNorm for Pre-LN, whose stream is
not normalised, as GPT-2's ln_f does; Post-LN and DeepNorm outputs already are) is read out
by a seeded random matrix W ∈ R^{V×d}, entries N(0, 1/d), and scored by cross-entropy against
seeded targets drawn from a Zipf distribution over the V classes, p(k) ∝ 1/(k+1) — real
text is Zipfian, and uniform targets hide the Post-LN / Pre-LN difference (REFERENCES.md).

A checkpoint's own loss is backpropagated layer by layer (`layerwise_gradient_report`): the
forward keeps each block's input only, and the backward reloads one block at a time from the top,
recomputes its forward from that input, backpropagates the gradient arriving at its output,
reduces its gradients to the reported norms and frees them. The peak is one layer's weights,
activations and gradients, whatever the model's size; every number equals a whole-model backward
(the same operations in the same order, per layer).

Reported: the gradient norm at each step's output (tensor hooks; with several mini-batches,
the mean of the per-batch norms) and, per layer, the Frobenius norms of the gradients of the
attention projections and of the FFN's W1 and W2, averaged over `batches` seeded
mini-batches *before* the norm is taken (the statistic of Xiong et al.'s Figure 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.nn import functional as F

from blocktrace.model.block import MIXERS
from blocktrace.model.layers import LatentAttention
from blocktrace.vocab import WEIGHT_NAMES

VOCAB = 256  # classes of the random readout


def weight_matrices(block) -> dict[str, torch.Tensor]:
    """The matrices whose gradients are reported, by the names the tables use. A mixture of experts has no one
    W1 and W2: its experts' gradients are among the parameters' (parameter_norms), its FFN columns are left out.
    Latent attention has no one K and V either: its q and output projections are reported, its latents' matrices
    are among the parameters'. A token mixer that is not attention (a short convolution, a gated delta net) has no
    Q, K or V: its output projection is reported, its input projections and filters are among the parameters'."""
    attn, ffn = block.attn, block.ffn
    if isinstance(attn, tuple(MIXERS.values())):
        matrices = [None, None, None, attn.out_proj]
    elif isinstance(attn, LatentAttention):
        matrices = [attn.q_proj if attn.latent.q_rank is None else attn.q_b_proj, None, None, attn.out_proj]
    else:
        matrices = [attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj]
    if hasattr(ffn, "down"):
        matrices += [ffn.up, ffn.down]
    elif hasattr(ffn, "fc"):
        matrices += [ffn.fc, ffn.proj]
    return {name: linear.weight for name, linear in zip(WEIGHT_NAMES, matrices) if linear is not None}


def zipf_targets(shape: tuple[int, ...], generator: torch.Generator, vocab: int = VOCAB) -> torch.Tensor:
    probabilities = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    flat = torch.multinomial(probabilities / probabilities.sum(), int(torch.tensor(shape).prod()),
                             replacement=True, generator=generator)
    return flat.reshape(shape)


def readout(d_model: int, seed: int, vocab: int = VOCAB) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed + 10_000)
    return torch.randn(vocab, d_model, generator=generator) / d_model**0.5


@dataclass
class GradientReport:
    loss: float  # mean over the mini-batches
    batches: int
    step_norms: list[dict[str, float]] = field(default_factory=list)  # per layer: step -> ‖∂L/∂output‖
    weight_norms: list[dict[str, float]] = field(default_factory=list)  # per layer: matrix -> ‖mean ∂L/∂W‖_F
    # per layer: parameter -> {"grad": ‖∂L/∂W‖, "weight": ‖W‖, "ratio": ‖∂L/∂W‖ / ‖W‖}
    parameter_norms: list[dict[str, dict]] = field(default_factory=list)
    loss_kind: str = "xiong"  # "xiong": the seeded readout of Xiong et al.; otherwise the model's own loss
    # the backward ran on the loss times a loss scaler's scale (a Watch under GradScaler): a non-finite gradient is
    # the scaler's to handle (it skips the step and lowers its scale)
    loss_scaled: bool = False


LossFn = Callable[[torch.Tensor, int], torch.Tensor]  # (the stack's output, batch k) -> scalar loss


def xiong_loss(d_model: int, seed: int, final_norm: bool) -> LossFn:
    """Xiong et al.'s readout: LayerNorm (Pre-LN streams), a seeded random matrix, Zipf targets."""
    w_out = readout(d_model, seed)

    def loss(x: torch.Tensor, k: int) -> torch.Tensor:
        if final_norm:
            x = F.layer_norm(x, x.shape[-1:])
        logits = x @ w_out.to(x.device, x.dtype).T
        targets = zipf_targets(logits.shape[:-1], torch.Generator().manual_seed(seed + 20_000 + k))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).to(logits.device))
    return loss


def _hook_step_outputs(blocks, sums: list[dict]) -> list:
    handles = []
    for layer, block in enumerate(blocks):
        for name, module in block.step_modules().items():
            def forward_hook(module, inputs, output, layer=layer, name=name):
                if output.requires_grad:
                    output.register_hook(lambda grad: sums[layer].__setitem__(
                        name, sums[layer].get(name, 0.0) + torch.linalg.vector_norm(grad.double())))
            handles.append(module.register_forward_hook(forward_hook))
    return handles


def _parameter_norms(block) -> dict[str, dict]:
    norms = {}
    for name, parameter in block.named_parameters():
        # No .grad: the loss does not reach it (an expert no token chose): its gradient is zero, and says so.
        grad = 0.0 if parameter.grad is None else torch.linalg.vector_norm(parameter.grad.double()).item()
        weight = torch.linalg.vector_norm(parameter.detach().double()).item()
        norms[name] = {"grad": grad, "weight": weight, "ratio": grad / weight if weight > 0 else float("inf")}
    return norms


def _gradients_of_one_block(block, x: torch.Tensor, grad_out: torch.Tensor, step_sums: dict) -> torch.Tensor:
    """Backpropagate `grad_out` through `block` from its input `x`; the gradient at the input. The block's
    parameters keep their .grad for the caller to read."""
    for p in block.parameters():
        p.requires_grad_(True)
        p.grad = None
    x = x.detach().requires_grad_(True)
    handles = _hook_step_outputs([block], [step_sums])
    try:
        block(x).backward(grad_out)
    finally:
        for handle in handles:
            handle.remove()
    return x.grad


def layerwise_gradient_report(load: Callable[[int], torch.nn.Module], inputs: list, output: torch.Tensor,
                              loss_fn: Callable[[torch.Tensor], torch.Tensor], *,
                              loss_kind: str) -> GradientReport:
    """The gradients of `loss_fn(output)` for a stack whose block l (`load(l)`, freshly read) took `inputs[l]` and
    whose last block gave `output`: one block in memory at a time, from the top down."""
    n_layers = len(inputs)
    top = output.detach().requires_grad_(True)
    loss = loss_fn(top)
    loss.backward()
    grad, step_sums = top.grad, [dict() for _ in range(n_layers)]
    weight_norms, parameter_norms = [None] * n_layers, [None] * n_layers
    for layer in reversed(range(n_layers)):
        block = load(layer)
        grad = _gradients_of_one_block(block, inputs[layer], grad, step_sums[layer])
        weight_norms[layer] = {name: torch.linalg.vector_norm(w.grad.double()).item()
                               for name, w in weight_matrices(block).items()}
        parameter_norms[layer] = _parameter_norms(block)
        del block  # its weights and gradients go before the next layer is read
    return GradientReport(loss=loss.item(), batches=1,
                          step_norms=[{name: value.item() for name, value in sums.items()} for sums in step_sums],
                          weight_norms=weight_norms, parameter_norms=parameter_norms, loss_kind=loss_kind)


def gradient_report(blocks: list, make_batch: Callable[[int], torch.Tensor], loss_fn: LossFn, *,
                    batches: int = 1, loss_kind: str = "xiong", key_mask=None) -> GradientReport:
    """Backward passes through `blocks` on `batches` mini-batches; `make_batch(k)` gives input k and
    `loss_fn(output, k)` its loss. Parameters' gradients are averaged over the batches."""
    parameters = [p for block in blocks for p in block.parameters()]
    saved_flags = [p.requires_grad for p in parameters]
    step_sums = [dict() for _ in blocks]
    handles = _hook_step_outputs(blocks, step_sums)
    losses = []
    try:
        for p in parameters:
            p.requires_grad_(True)
            p.grad = None
        for k in range(batches):
            x = make_batch(k)
            for block in blocks:
                x = block(x)
            loss = loss_fn(x, k)
            (loss / batches).backward()  # gradients accumulate into the mean over batches
            losses.append(loss.detach())
        weight_norms = [{name: torch.linalg.vector_norm(w.grad.double()) for name, w in weight_matrices(b).items()}
                        for b in blocks]
        parameter_norms = [_parameter_norms(block) for block in blocks]
    finally:
        for handle in handles:
            handle.remove()
        for p, flag in zip(parameters, saved_flags):
            p.grad = None
            p.requires_grad_(flag)
    return GradientReport(
        loss=torch.stack(losses).mean().item(),
        batches=batches,
        step_norms=[{name: (sums[name] / batches).item() for name in sums} for sums in step_sums],
        weight_norms=[{name: value.item() for name, value in norms.items()} for norms in weight_norms],
        parameter_norms=parameter_norms,
        loss_kind=loss_kind,
    )
