"""GPT-2 (`h.{k}.…`; `transformer.` prefix as GPT2LMHeadModel saves it): Pre-LN.

Its linear layers are Conv1D, `[in, out]`, used as `x @ W + b`, with q, k and v concatenated
on the output side of `attn.c_attn`; ours are nn.Linear, `[out, in]`: loaded as transposed
views, not copies (the GEMM reads a transposed operand as fast, and loading stays cheap).
"""

from __future__ import annotations

import dataclasses

from blocktrace.errors import UsageError
from blocktrace.sources.families.base import (Family, HeadSpec, HFLayer, LossKind, activation, head_weight, linear,
                                              refuse_unless, size)
from blocktrace.vocab import FFNKind, Norm

GPT2_STEPS = {"norm1": "ln_1", "attn": "attn", "norm2": "ln_2", "ffn": "mlp"}  # GPT2Block's and nanoGPT's Block's


class GPT2(Family):
    name, described = "gpt2", "gpt2 (h.{k}.* or transformer.h.{k}.*)"
    hf_classes, hf_layer = ("GPT2Block",), HFLayer(GPT2_STEPS, hidden="mlp.act")
    layers_path, marker, prefixes, embedding_key = "h", "ln_1.weight", ("", "transformer."), "wte.weight"
    ignored = ("attn.bias", "attn.masked_bias")  # causal-mask buffers of old files
    tie_default = True
    learned_positions = True
    config_keys = {"d_model": "n_embd", "n_heads": "n_head", "d_ff": "n_inner", "eps": "layer_norm_epsilon"}

    def config_fields(self, config):
        # Options HF allows that change the attention arithmetic: refuse rather than differ silently.
        refuse_unless(config, "scale_attn_weights", (True,), "turns off the 1/√d_head scaling")
        refuse_unless(config, "scale_attn_by_inverse_layer_idx", (False,), "scales attention by 1/(layer+1)")
        refuse_unless(config, "reorder_and_upcast_attn", (False,), "upcasts attention differently")
        return {"d_model": config.integer("n_embd"), "n_heads": config.integer("n_head"),
                "d_ff": config.integer("n_inner"), "eps": config.number("layer_norm_epsilon", 1e-5, positive=True),
                "ffn": activation(config, "activation_function", "gelu_new")}

    def shape_fields(self, checkpoint, base):
        return {"d_model": size(checkpoint, base + "ln_1.weight", 0), "d_ff": size(checkpoint, base + "mlp.c_fc.weight", 1),
                "eps": 1e-5, "ffn": FFNKind.GELU_TANH}

    def parameters(self, read, c):
        d, f = c.d_model, c.d_ff
        qkv_weight = read("attn.c_attn.weight", (d, 3 * d)).t()  # Conv1D [in, out] -> Linear [out, in]
        qkv_bias = read("attn.c_attn.bias", (3 * d,))
        state = {"norm1.weight": read("ln_1.weight", (d,)), "norm1.bias": read("ln_1.bias", (d,)),
                 "norm2.weight": read("ln_2.weight", (d,)), "norm2.bias": read("ln_2.bias", (d,)),
                 **linear(read, "attn.c_proj", "attn.out_proj", d, d, True, transpose=True),
                 **linear(read, "mlp.c_fc", "ffn.fc", f, d, True, transpose=True),
                 **linear(read, "mlp.c_proj", "ffn.proj", d, f, True, transpose=True)}
        for index, name in enumerate(("q_proj", "k_proj", "v_proj")):
            state[f"attn.{name}.weight"] = qkv_weight[index * d : (index + 1) * d]
            state[f"attn.{name}.bias"] = qkv_bias[index * d : (index + 1) * d]
        return state

    def variant(self, checkpoint, prefix):
        """nanoGPT's layout: GPT-2's names on nn.Linear weights, c_attn stored [3d, d] instead of Conv1D's [d, 3d]."""
        base = f"{prefix}{self.layers_path}.0."
        d = size(checkpoint, base + "ln_1.weight", 0)
        if base + "attn.c_attn.weight" in checkpoint and checkpoint.shape(base + "attn.c_attn.weight") == (3 * d, d):
            return NanoGPT()
        return self

    def embed(self, checkpoint, info, ids, dtype, token_types=None):
        positions = checkpoint.get(f"{info.prefix}wpe.weight", dtype, rows=slice(0, len(ids)))
        return super().embed(checkpoint, info, ids, dtype) + positions

    def head(self, checkpoint, info):
        """ln_f, then the LM head — tied to wte, as GPT2LMHeadModel saves it (no lm_head.weight)."""
        weight, tied = head_weight(checkpoint, info, "lm_head.weight", f"{info.prefix}wte.weight")
        eps = info.config.number("layer_norm_epsilon", 1e-5, positive=True) if info.config else 1e-5
        return HeadSpec(LossKind.NEXT_TOKEN, weight, f"{info.prefix}ln_f.weight", f"{info.prefix}ln_f.bias",
                        eps=eps, tied=tied)

    def check(self, config):
        if not config.ffn.plain or config.norm is not Norm.LAYERNORM or not config.bias:
            raise UsageError("GPT-2 weights need --norm layernorm, --bias and a non-gated --ffn (gelu, gelu_tanh, relu "
                             "or relu2)")


class NanoGPT(GPT2):
    """nanoGPT (Karpathy's model.py) and GPT-2s written with nn.Linear: the same names, weights stored
    `[out, in]`, biases optional (nanoGPT's `bias=False`), and nn.GELU() — the exact GELU, not GPT-2's tanh form."""

    name, described = "nanogpt", "nanoGPT (transformer.h.{k}.*, nn.Linear weights [out, in])"
    hf_classes = ()  # nanoGPT's Block is told by its submodule names (tracing.steps.NAMED_LAYOUTS)
    model_types = ()  # no config.json of its own

    def variant(self, checkpoint, prefix):
        return self

    def config_fields(self, config):
        fields = super().config_fields(config) if "n_embd" in config else {}
        if "bias" in config:
            fields["bias"] = config.boolean("bias")
        fields["ffn"] = activation(config, "activation_function", "gelu")
        return fields

    def shape_fields(self, checkpoint, base):
        return {"d_model": size(checkpoint, base + "ln_1.weight", 0), "d_ff": size(checkpoint, base + "mlp.c_fc.weight", 0),
                "eps": 1e-5, "ffn": FFNKind.GELU, "bias": base + "ln_1.bias" in checkpoint}

    def parameters(self, read, c):
        d, f, bias = c.d_model, c.d_ff, c.bias
        qkv = linear(read, "attn.c_attn", "qkv", 3 * d, d, bias)
        state = {"norm1.weight": read("ln_1.weight", (d,)), "norm2.weight": read("ln_2.weight", (d,)),
                 **linear(read, "attn.c_proj", "attn.out_proj", d, d, bias),
                 **linear(read, "mlp.c_fc", "ffn.fc", f, d, bias),
                 **linear(read, "mlp.c_proj", "ffn.proj", d, f, bias)}
        if bias:
            state.update({"norm1.bias": read("ln_1.bias", (d,)), "norm2.bias": read("ln_2.bias", (d,))})
        for index, name in enumerate(("q_proj", "k_proj", "v_proj")):
            for kind in ("weight", "bias") if bias else ("weight",):
                state[f"attn.{name}.{kind}"] = qkv[f"qkv.{kind}"][index * d : (index + 1) * d]
        return state

    def head(self, checkpoint, info):
        spec = super().head(checkpoint, info)
        return dataclasses.replace(spec, norm_bias=spec.norm_bias if spec.norm_bias in checkpoint else None)

    def notes(self, config):
        notes = ["read as nanoGPT's layout: GPT-2's tensor names with nn.Linear weights [out, in] (c_attn is [3d, d])"]
        if config is None or "activation_function" not in config:
            notes.append("activation assumed nn.GELU() (exact, as nanoGPT's MLP), not GPT-2's tanh approximation")
        if config is None or "layer_norm_epsilon" not in config:
            notes.append("LayerNorm eps assumed 1e-5 (nanoGPT's and PyTorch's default)")
        return notes

    def check(self, config):
        if not config.ffn.plain or config.norm is not Norm.LAYERNORM:
            raise UsageError("nanoGPT weights need --norm layernorm and a non-gated --ffn (gelu, gelu_tanh, relu or "
                             "relu2)")
