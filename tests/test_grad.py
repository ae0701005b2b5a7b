"""`check --weights --grad` backpropagates one layer at a time (diagnose.grad.layerwise_gradient_report): its numbers
are a whole-model backward's — HF's, per parameter and at every layer's output — and its memory is one layer's, so a
checkpoint whose whole-model backward would not fit is checked."""

from __future__ import annotations

import json
import weakref

import pytest
import torch
from helpers import DEEPSEEK, LLAMA4, make_deepseek, randomise_hf

IDS = [5, 17, 99, 3, 42, 7, 63, 11]


def _model(name: str, layers: int = 3, width: int = 32):
    import transformers

    small = dict(hidden_size=width, num_attention_heads=4, num_key_value_heads=2, intermediate_size=2 * width,
                 num_hidden_layers=layers, vocab_size=101, max_position_embeddings=64, attn_implementation="eager")
    if name in DEEPSEEK:  # latent attention, a dense layer, then grouped routers and shared experts
        return make_deepseek(name, {**small, "num_key_value_heads": 4}, seed=11)
    if name == "llama4_text":  # chunked and NoPE layers, experts stored [E, d, 2f]
        model = transformers.Llama4ForCausalLM(transformers.Llama4TextConfig(**{**small, **LLAMA4},
                                                                             num_experts_per_tok=2))
        randomise_hf(model, seed=11)
        return model.eval()
    if name == "mixtral":
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**small, num_local_experts=4,
                                                                           num_experts_per_tok=2))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**small))
    randomise_hf(model, seed=11)
    return model.eval()


def _pieces(name: str, grad: torch.Tensor, model) -> list[torch.Tensor]:
    """HF 5 keeps a mixture's experts fused (gate_up_proj [E, 2f, d], down_proj [E, d, f]; Llama-4's [E, d, 2f] and
    [E, f, d]); blocktrace keeps one tensor per expert and matrix, as the checkpoint stores them: HF's split the same
    way."""
    if name.endswith("experts.gate_up_proj"):
        columns = type(model).__name__.startswith("Llama4")
        return [half for expert in grad for half in expert.chunk(2, dim=1 if columns else 0)]
    if name.endswith("experts.down_proj"):
        return list(grad)
    return [grad]


def _hf_gradients(model) -> tuple[list[list[float]], list[float]]:
    """Per layer, every parameter's gradient norm (sorted: the names differ, the values must not), and the norm of
    the gradient at each layer's output but the last (HF's last hidden state is after the final norm)."""
    model.zero_grad()
    output = model(torch.tensor([IDS]), labels=torch.tensor([IDS]), output_hidden_states=True)
    hidden = output.hidden_states
    for h in hidden:
        h.retain_grad()
    output.loss.backward()
    parameters = [sorted(torch.linalg.vector_norm(piece.double()).item() for name, p in layer.named_parameters()
                         for piece in _pieces(name, p.grad, model)) for layer in model.model.layers]
    outputs = [torch.linalg.vector_norm(hidden[k + 1].grad.double()).item() for k in range(len(model.model.layers) - 1)]
    return parameters, outputs


@pytest.mark.parametrize("name", ["llama", "mixtral", "deepseek_v3", "deepseek_v2", "llama4_text"])
def test_every_parameters_gradient_and_every_layer_outputs_equal_a_whole_hf_backward(invoke, tmp_path, name):
    model = _model(name)
    model.save_pretrained(tmp_path)
    report = json.loads(invoke("check", "--weights", str(tmp_path), "--token-ids", *map(str, IDS), "--grad",
                               "--json").stdout)
    parameters, outputs = _hf_gradients(model)
    layers = report["gradients"]["layers"]
    for k, expected in enumerate(parameters):
        ours = sorted(entry["grad"] for entry in layers[k]["parameters"].values())
        assert ours == pytest.approx(expected, rel=1e-5), k
    for k, expected in enumerate(outputs):
        assert layers[k]["step_grad_norms"]["residual2"] == pytest.approx(expected, rel=1e-5), k


def test_a_checkpoint_whose_whole_backward_would_not_fit_is_checked_one_layer_at_a_time(invoke, tmp_path,
                                                                                       monkeypatch):
    """Eight layers under a memory cap that one layer with its gradients fits and the whole model's backward would
    not: the check runs, no more than one block is ever alive, and its numbers are HF's."""
    import blocktrace.sizing
    import blocktrace.sources.loader as loader
    from blocktrace.config import BlockConfig
    from blocktrace.sizing import Shape, estimate_bytes

    model = _model("llama", layers=8, width=128)
    model.save_pretrained(tmp_path)
    config = BlockConfig(d_model=128, n_heads=4, d_ff=256, ffn="swiglu", norm="rmsnorm", kv_heads=2)
    shape, common = Shape(1, len(IDS)), dict(keep_tensors=False, chunk_bytes=1 << 20, attn_chunk=None)
    whole = estimate_bytes(config, 8, shape, 4, grad=True, **common)
    one_layer = estimate_bytes(config, 1, shape, 4, grad=True, kept_streams=9, **common)
    cap = (whole + one_layer) // 2  # the guard's share of it lies between the two
    monkeypatch.setattr(blocktrace.sizing, "available_bytes", lambda device: int(cap / blocktrace.sizing.FIT_FRACTION))

    alive, most = [], [0]
    original = loader.load_block

    def counting(*args, **kwargs):
        block = original(*args, **kwargs)
        alive[:] = [ref for ref in alive if ref() is not None]
        alive.append(weakref.ref(block))
        most[0] = max(most[0], len(alive))
        return block

    monkeypatch.setattr(loader, "load_block", counting)
    result = invoke("check", "--weights", str(tmp_path), "--token-ids", *map(str, IDS), "--grad", "--json")
    assert result.exit_code in (0, 1), result.output
    assert most[0] <= 2  # the block being read while the last one's references go
    parameters, _ = _hf_gradients(model)
    layers = json.loads(result.stdout)["gradients"]["layers"]
    assert [sorted(e["grad"] for e in layer["parameters"].values()) for layer in layers] == \
        [pytest.approx(expected, rel=1e-5) for expected in parameters]
