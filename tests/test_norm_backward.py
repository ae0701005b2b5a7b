"""norm_backward_not_its_derivative: a norm whose forward normalises but whose backward is not the forward's
derivative (statistics detached from the graph, a hand-written backward) is found on the module, in a trace and in
a Watch; every legitimate norm — PyTorch's, nanoGPT's, HF's Llama/Gemma/T5 ones, 16-bit, with trained gains of
either sign, a correct hand-written backward — passes."""

from __future__ import annotations

import pytest
import torch
from helpers import NanoGPT, nano_batch
from torch import nn
from torch.nn import functional as F

from blocktrace.diagnose.health import evaluate
from blocktrace.host import to_host
from blocktrace.tracing.behaviour import NormKind, measure_norm
from blocktrace.tracing.tracer import trace
from blocktrace.training.watch import Watch

WIDTH = 48


class _Gains(nn.Module):
    def __init__(self, width: int = WIDTH):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(width)), nn.Parameter(torch.zeros(width))


class DetachedStatistics(_Gains):
    """The learner's LayerNorm that 'saves memory' by detaching both statistics."""

    def forward(self, x):
        mean = x.mean(-1, keepdim=True).detach()
        variance = x.var(-1, keepdim=True, unbiased=False).detach()
        return (x - mean) / torch.sqrt(variance + 1e-5) * self.weight + self.bias


class DetachedVariance(_Gains):
    def forward(self, x):
        centred = x - x.mean(-1, keepdim=True)
        return centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True).data + 1e-5) * self.weight + self.bias


class DetachedMean(_Gains):
    def forward(self, x):
        centred = x - x.mean(-1, keepdim=True).detach()
        return centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight + self.bias


class DetachedRMS(_Gains):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6).detach() * self.weight


class _StraightThrough(torch.autograd.Function):
    """A hand-written LayerNorm whose backward forgets the statistics' terms (γ ⊙ g / σ)."""

    @staticmethod
    def forward(ctx, x, weight):
        sigma = torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5)
        ctx.save_for_backward(weight, sigma)
        return (x - x.mean(-1, keepdim=True)) / sigma * weight

    @staticmethod
    def backward(ctx, grad):
        weight, sigma = ctx.saved_tensors
        return grad * weight / sigma, None


class _ExactBackward(torch.autograd.Function):
    """A hand-written LayerNorm (no gains) with the full derivative: (g − mean g − n·mean(g ⊙ n)) / σ."""

    @staticmethod
    def forward(ctx, x):
        sigma = torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5)
        n = (x - x.mean(-1, keepdim=True)) / sigma
        ctx.save_for_backward(n, sigma)
        return n

    @staticmethod
    def backward(ctx, grad):
        n, sigma = ctx.saved_tensors
        return (grad - grad.mean(-1, keepdim=True) - n * (grad * n).mean(-1, keepdim=True)) / sigma


class WrongBackward(_Gains):
    def forward(self, x):
        return _StraightThrough.apply(x, self.weight) + self.bias


class ExactBackward(_Gains):
    def forward(self, x):
        return _ExactBackward.apply(x) * self.weight + self.bias


class NanoGPTLayerNorm(_Gains):
    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


def _hf_norms():
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.t5.modeling_t5 import T5LayerNorm
    return [LlamaRMSNorm(WIDTH), GemmaRMSNorm(WIDTH), T5LayerNorm(WIDTH)]


def _trained(module: nn.Module, seed: int = 0) -> nn.Module:
    """Gains and biases as training leaves them: spread around their start, some gains negative."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator).to(parameter.dtype) * 0.7)
    return module


def _behaviour(module: nn.Module):
    measured = measure_norm(module, WIDTH)
    return measured.probe(to_host(measured.values()))["norm"]


LEGITIMATE = {
    "nn.LayerNorm": lambda: nn.LayerNorm(WIDTH),
    "nn.LayerNorm without affine": lambda: nn.LayerNorm(WIDTH, elementwise_affine=False),
    "nn.LayerNorm without bias": lambda: nn.LayerNorm(WIDTH, bias=False),
    "nn.RMSNorm": lambda: nn.RMSNorm(WIDTH),
    "nn.RMSNorm eps 1e-3": lambda: nn.RMSNorm(WIDTH, eps=1e-3),
    "nanoGPT's LayerNorm": lambda: NanoGPTLayerNorm(),
    "a correct hand-written backward": lambda: ExactBackward(),
    "nn.LayerNorm in bfloat16": lambda: nn.LayerNorm(WIDTH).bfloat16(),
    "nn.LayerNorm in float16": lambda: nn.LayerNorm(WIDTH).half(),
    "nn.RMSNorm in bfloat16": lambda: nn.RMSNorm(WIDTH).bfloat16(),
    **{type(norm).__name__: (lambda norm=norm: norm) for norm in _hf_norms()},
}

BROKEN = {
    "mean and variance detached": (DetachedStatistics, NormKind.LAYERNORM),
    "variance through .data": (DetachedVariance, NormKind.LAYERNORM),
    "mean detached": (DetachedMean, NormKind.LAYERNORM),
    "RMS detached": (DetachedRMS, NormKind.RMSNORM),
    "a hand-written backward without the statistics' terms": (WrongBackward, NormKind.LAYERNORM),
}


@pytest.mark.parametrize("name", list(LEGITIMATE))
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_a_norm_whose_backward_is_its_derivative_passes(name, seed):
    module = LEGITIMATE[name]()
    if seed is not None:
        _trained(module, seed)
    behaviour = _behaviour(module)
    assert behaviour.kind is not NormKind.NONE
    assert behaviour.gradient_error is not None and not behaviour.backward_broken, behaviour


@pytest.mark.parametrize("name", list(BROKEN))
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_a_norm_whose_backward_is_not_its_derivative_is_found(name, seed):
    make, kind = BROKEN[name]
    module = make()
    if seed is not None:
        _trained(module, seed)
    behaviour = _behaviour(module)
    assert behaviour.kind is kind  # the forward normalises: only the backward tells
    assert behaviour.gradient_error > 0.3 and behaviour.backward_broken, behaviour


def test_the_gradient_measured_is_the_one_autograd_passes_back():
    """The broken backward's component, computed here by hand from γ ⊙ v / σ for unit gains, is the probe's."""
    module = DetachedVariance()
    behaviour = _behaviour(module)
    x = torch.randn(1, 8, WIDTH, generator=torch.Generator().manual_seed(1234)).double() * 2 + 0.5
    centred = x - x.mean(-1, keepdim=True)
    sigma = torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-5)
    n = centred / centred.pow(2).mean(-1, keepdim=True).sqrt()
    cotangent = centred / sigma * n.abs()  # v = u ⊙ |n|, u = (x − μ) / σ the output less its bias
    gradient = cotangent / sigma  # σ held constant; the mean, still in the graph, takes the mean of v / σ out
    gradient = gradient - gradient.mean(-1, keepdim=True)
    cosine = ((gradient * x).sum(-1).abs() / (gradient.norm(dim=-1) * x.norm(dim=-1))).max().item()
    assert behaviour.gradient_error == pytest.approx(cosine, rel=1e-3)


def test_a_module_that_keeps_no_graph_is_not_measured():
    class Frozen(nn.LayerNorm):
        def forward(self, x):
            with torch.no_grad():
                return super().forward(x)

    assert _behaviour(Frozen(WIDTH)).gradient_error is None


def test_a_traced_block_with_a_detached_norm_is_an_error_of_the_norm():
    model = NanoGPT(d=WIDTH)
    block = model.h[0]
    block.ln_2 = DetachedStatistics()
    x = torch.randn(2, 8, WIDTH, generator=torch.Generator().manual_seed(0))
    flags = [f for f in evaluate([trace(block, x, checks=True)]) if f.name == "norm_backward_not_its_derivative"]
    assert [(f.step, f.level, f.cause) for f in flags] == [("norm2", "error", "gradient_flow")]


def test_a_watch_finds_the_detached_norm_at_its_first_record_and_a_healthy_model_passes(tmp_path):
    def first_record(broken: bool) -> dict:
        torch.manual_seed(0)
        model = NanoGPT()
        if broken:
            for block in model.h:
                block.ln_1 = DetachedStatistics(16)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with Watch(model, tmp_path / f"{broken}.jsonl", every=5) as watch:
            ids, targets = nano_batch(0)
            _, loss = model(ids, targets)
            optimizer.zero_grad()
            loss.backward()
            entry = watch.step(loss)
            optimizer.step()
        return entry

    broken = first_record(True)
    found = [f for f in broken["flags"] if f["name"] == "norm_backward_not_its_derivative"]
    assert {(f["layer"], f["step"], f["level"]) for f in found} == {(0, "norm1", "error"), (1, "norm1", "error")}
    assert broken["diagnosis"][0]["cause"] == "gradient_flow"  # a .detach() cuts the gradient's path
    assert not [f for f in first_record(False)["flags"] if f["name"] == "norm_backward_not_its_derivative"]
