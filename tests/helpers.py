"""Helpers the tests share: HF models with every parameter random, and HF's own step values.

Not a test module: tests import it as `helpers` (pyproject sets pytest's pythonpath), so the
suite runs from any directory and under --import-mode=importlib.
"""

from __future__ import annotations

import ast
import functools
import json
import math
import shutil
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_weights"

GPT2_TEST_CONFIG = dict(n_embd=32, n_head=4, n_layer=3, n_positions=64, vocab_size=101)


def randomise_(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random, biases and LayerNorm gains included, so no mapping error can hide."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                parameter.copy_(1.0 + 0.3 * noise)
            elif name.endswith("bias"):
                parameter.copy_(0.2 * noise)
            else:
                parameter.copy_(0.15 * noise)


def make_gpt2(head: bool, seed: int = 0, **overrides):
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

    config = GPT2Config(**{**GPT2_TEST_CONFIG, **overrides}, attn_implementation="eager")
    model = (GPT2LMHeadModel if head else GPT2Model)(config).eval()
    randomise_(model, seed)
    return model


TOKEN_IDS = [5, 17, 99, 0, 42, 7, 63]


def hf_block_values(hf_model, layer: int, token_ids: list[int]) -> dict[str, torch.Tensor]:
    """Tensors HF computes inside block `layer`, captured with hooks on its own modules."""
    block = hf_model.h[layer]
    seen = {}
    hooks = [
        block.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0])),
        block.ln_1.register_forward_hook(lambda m, i, o: seen.__setitem__("norm1", o)),
        block.attn.register_forward_hook(lambda m, i, o: seen.update(attn=o[0], attn_weights=o[1])),
        block.ln_2.register_forward_pre_hook(lambda m, args: seen.__setitem__("residual1", args[0])),
        block.ln_2.register_forward_hook(lambda m, i, o: seen.__setitem__("norm2", o)),
        block.mlp.register_forward_hook(lambda m, i, o: seen.__setitem__("ffn", o)),
        block.register_forward_hook(lambda m, i, o: seen.__setitem__("residual2", o[0] if isinstance(o, tuple) else o)),
    ]
    try:
        with torch.no_grad():
            outputs = hf_model(torch.tensor([token_ids]), output_hidden_states=True)
    finally:
        for hook in hooks:
            hook.remove()
    seen["hidden_state"] = outputs.hidden_states[layer]
    return seen


def _first(value):
    return value[0] if isinstance(value, tuple) else value


def capture(model, places: dict, ids) -> dict:
    """HF's own values at `places` ({name: (module, "in" | "out" | "weights")}) and its hidden states."""
    return _capture(None, places, model, ids)


def randomise_hf(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random; norm gains near 1 (Gemma's (1 + w) norms: w near 0)."""
    generator = torch.Generator().manual_seed(seed)
    offset_norms = {id(m.weight) for m in model.modules() if "Gemma" in type(m).__name__ and "RMSNorm" in type(m).__name__}
    norms = {id(m.weight) for m in model.modules() if "Norm" in type(m).__name__ and getattr(m, "weight", None) is not None}
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if id(parameter) in offset_norms:
                parameter.copy_(0.3 * noise)
            elif id(parameter) in norms:
                parameter.copy_(1.0 + 0.3 * noise)
            elif name.endswith("bias"):
                parameter.copy_(0.2 * noise)
            else:
                parameter.copy_(0.15 * noise)


def _capture(layer, places: dict, model, ids):
    seen, hooks = {}, []
    for name, (module, where) in places.items():
        if where == "in":
            hooks.append(module.register_forward_pre_hook(lambda m, a, name=name: seen.__setitem__(name, a[0])))
        elif where == "weights":
            hooks.append(module.register_forward_hook(lambda m, a, o, name=name: seen.__setitem__(name, o[1])))
        else:
            hooks.append(module.register_forward_hook(lambda m, a, o, name=name: seen.__setitem__(name, _first(o))))
    try:
        with torch.no_grad():
            seen["hidden_states"] = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def bert_reference(model, k, ids):
    layer = model.encoder.layer[k]
    places = {"attn": (layer.attention.output.dense, "out"), "residual1": (layer.attention.output.LayerNorm, "in"),
              "norm1": (layer.attention.output.LayerNorm, "out"), "ffn": (layer.output.dense, "out"),
              "residual2": (layer.output.LayerNorm, "in"), "norm2": (layer.output.LayerNorm, "out"),
              "attn_weights": (layer.attention.self, "weights")}
    return _capture(layer, places, model, ids)


def llama_reference(model, k, ids):
    layer = model.layers[k]
    places = {"norm1": (layer.input_layernorm, "out"), "attn": (layer.self_attn, "out"),
              "attn_weights": (layer.self_attn, "weights"), "residual1": (layer.post_attention_layernorm, "in"),
              "norm2": (layer.post_attention_layernorm, "out"), "ffn": (layer.mlp, "out"),
              "residual2": (layer, "out")}
    return _capture(layer, places, model, ids)


def make_bert(head: bool):
    from transformers import BertConfig, BertForMaskedLM, BertModel

    config = BertConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=3,
                        vocab_size=101, max_position_embeddings=64, attn_implementation="eager")
    model = (BertForMaskedLM if head else BertModel)(config).eval()
    randomise_(model, 3)
    with torch.no_grad():  # LayerNorm gains near 1, as trained models have them (randomise_ knows GPT-2's names)
        for name, parameter in model.named_parameters():
            if name.endswith("LayerNorm.weight"):
                parameter.add_(1.0)
    return model, (model.bert if head else model)


def make_llama(head: bool, **extra):
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel

    config = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                         num_hidden_layers=3, vocab_size=101, max_position_embeddings=64,
                         attn_implementation="eager", **extra)
    model = (LlamaForCausalLM if head else LlamaModel)(config).eval()
    randomise_(model, 4)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                parameter.add_(1.0)
    return model, (model.model if head else model)


class NanoAttention(torch.nn.Module):  # nanoGPT's CausalSelfAttention, through scaled_dot_product_attention
    def __init__(self, d: int, heads: int, causal: bool = True):
        super().__init__()
        self.c_attn, self.c_proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.heads, self.causal = heads, causal

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.c_attn(x).split(c, 2))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class NanoBlock(torch.nn.Module):  # nanoGPT's Block
    def __init__(self, d: int, heads: int, causal: bool = True):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = torch.nn.LayerNorm(d), NanoAttention(d, heads, causal), torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(torch.nn.Module):
    """A small nanoGPT: returns (logits, loss) as nanoGPT does."""

    def __init__(self, vocab: int = 61, d: int = 16, heads: int = 2, layers: int = 2, context: int = 32,
                 causal: bool = True):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, d), torch.nn.Embedding(context, d)
        self.h = torch.nn.ModuleList(NanoBlock(d, heads, causal) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(d)

    def forward(self, ids, targets=None):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.T
        loss = None if targets is None else torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


def nano_batch(step: int, vocab: int = 61, batch: int = 3, tokens: int = 12):
    """A deterministic batch (ids, targets) for training step `step`."""
    generator = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, vocab, (batch, tokens + 1), generator=generator)
    return ids[:, :-1], ids[:, 1:]


def watched_records(path, steps: int = 2, seed: int = 0) -> list[dict]:
    """The records a real Watch writes to `path` over `steps` SGD steps of NanoGPT, as parsed JSON lines."""
    import json

    from blocktrace.training.watch import Watch

    torch.manual_seed(seed)
    model = NanoGPT()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    with Watch(model, path, every=1) as watch:
        for step in range(steps):
            ids, targets = nano_batch(step)
            optimizer.zero_grad()
            model(ids, targets)[1].backward()
            watch.step()
            optimizer.step()
    return [json.loads(line) for line in path.read_text().splitlines()]


# DeepSeek's small test models: latent attention's widths (each head's q and k 8 unrotated + 8 rotated dims, values
# 12, keys and values from a latent of 16), and per variant what sets it apart.
DEEPSEEK_LATENT = dict(num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12,
                       moe_intermediate_size=16)
# Llama-4's small test model: RoPE layers 0 and 2 attend in chunks of 4 (llama3 RoPE past its context, L2 QK-norm),
# layer 1 is NoPE with a query temperature that grows every 2 tokens; layers 1 and 2 are experts, 0 dense.
LLAMA4 = dict(num_key_value_heads=2, head_dim=8, intermediate_size=16, intermediate_size_mlp=64, no_rope_layers=[1, 0, 1],
              moe_layers=[1, 2], num_local_experts=4, attention_chunk_size=4, floor_scale=2, attn_scale=0.3,
              rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 4, "rope_theta": 500.0})

DEEPSEEK = {
    # V3: q through its own latent, YaRN with DeepSeek's mscale past the context; a dense first layer, then experts
    # chosen by biased sigmoid scores within the best 2 of 4 groups, two shared experts.
    "deepseek_v3": ("DeepseekV3Config", dict(
        **DEEPSEEK_LATENT, q_lora_rank=24, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3,
        first_k_dense_replace=1, n_shared_experts=2, routed_scaling_factor=1.7,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "rope_theta": 10000.0})),
    # V2: q projected directly, softmax scores chosen within the groups with the largest maximum.
    "deepseek_v2": ("DeepseekV2Config", dict(
        **DEEPSEEK_LATENT, q_lora_rank=None, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3,
        topk_method="group_limited_greedy", first_k_dense_replace=1, routed_scaling_factor=1.5)),
    "deepseek_v2 greedy": ("DeepseekV2Config", dict(
        **DEEPSEEK_LATENT, q_lora_rank=16, n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=0,
        n_shared_experts=1, attention_bias=True)),
}


def make_deepseek(name: str, small: dict, seed: int):
    """A DeepSeek model of `small`'s sizes, every parameter and the choice bias random (large)."""
    import transformers

    config_class, extra = DEEPSEEK[name]
    model = getattr(transformers, config_class.replace("Config", "ForCausalLM"))(
        getattr(transformers, config_class)(**{**small, **extra}))
    randomise_hf(model, seed)
    randomise_choice_bias(model, seed)
    return model.eval()


def randomise_choice_bias(model, seed: int) -> None:
    """DeepSeek-V3's e_score_correction_bias is a buffer (randomise_hf draws parameters): large enough to change
    which experts are chosen, so reading it wrongly shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            bias = getattr(module, "e_score_correction_bias", None)
            if bias is not None:
                bias.copy_(0.5 * torch.randn(bias.shape, generator=generator))


# The bad-input contract's helpers (docs/reference.md: Errors).
GPT2 = SAMPLES / "gpt2-tiny"


def strict_json(text: str):
    """JSON without NaN / Infinity, which json.loads would otherwise accept."""
    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def one_error_line(result, code: int, *fragments: str) -> None:
    """One `Error:` line naming each fragment, exit `code`, no traceback."""
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert "Traceback" not in result.output


def copy_sample(tmp_path: Path, name: str = "gpt2-tiny") -> Path:
    target = tmp_path / name
    shutil.copytree(SAMPLES / name, target)
    return target


def numpy_stats(a) -> list[float]:
    """tracing.stats' STAT_NAMES of a numpy array, computed by numpy in float64 (none of it non-finite)."""
    finite = a.astype(np.float64)
    return [finite.mean(), finite.std(), finite.min(), finite.max(), math.sqrt((finite**2).mean()),
            np.abs(finite).max(), 0, 0]


@functools.lru_cache(maxsize=None)
def parsed_source(path: Path) -> ast.Module:
    """A source file's syntax tree, parsed once per process (test_imports and test_suite_map read every module)."""
    return ast.parse(path.read_text(encoding="utf-8"))
