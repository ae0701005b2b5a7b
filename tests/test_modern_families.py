"""Mistral, Qwen2, Qwen3, Gemma, Gemma-2, GPT-NeoX and Phi-3: every step of blocktrace's block,
read from HF's own checkpoint layout, equals what HuggingFace computes at the same place; and
each HF decoder layer, traced bare, equals itself inside its model."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import DEEPSEEK, LLAMA4, capture, randomise_choice_bias, randomise_hf

from blocktrace.errors import WeightsError
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import checkpoint_config, model_info
from blocktrace.sources.loader import embed_token_ids, hidden_state_before, load_block
from blocktrace.tracing.tracer import trace

IDS = [3, 14, 15, 92, 65, 35, 8, 42, 7]  # 9 tokens: longer than the sliding windows below
SMALL = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=3, vocab_size=101,
             max_position_embeddings=64, attn_implementation="eager")
LLAMA_PLACES = {"norm1": ("input_layernorm", "out"), "attn": ("self_attn", "out"),
                "attn_weights": ("self_attn", "weights"), "residual1": ("post_attention_layernorm", "in"),
                "norm2": ("post_attention_layernorm", "out"), "ffn": ("mlp", "out"), "residual2": ("", "out")}
APERTUS_PLACES = {"norm1": ("attention_layernorm", "out"), "attn": ("self_attn", "out"),
                  "attn_weights": ("self_attn", "weights"), "residual1": ("feedforward_layernorm", "in"),
                  "norm2": ("feedforward_layernorm", "out"), "ffn": ("mlp", "out"), "residual2": ("", "out")}
GEMMA2_PLACES = {"norm1": ("input_layernorm", "out"), "attn": ("self_attn", "out"),
                 "attn_weights": ("self_attn", "weights"), "post_attn_norm": ("post_attention_layernorm", "out"),
                 "residual1": ("pre_feedforward_layernorm", "in"), "norm2": ("pre_feedforward_layernorm", "out"),
                 "ffn": ("mlp", "out"), "post_ffn_norm": ("post_feedforward_layernorm", "out"), "residual2": ("", "out")}
GLM4_PLACES = {"norm1": ("input_layernorm", "out"), "attn": ("self_attn", "out"),
               "attn_weights": ("self_attn", "weights"), "post_attn_norm": ("post_self_attn_layernorm", "out"),
               "residual1": ("post_attention_layernorm", "in"), "norm2": ("post_attention_layernorm", "out"),
               "ffn": ("mlp", "out"), "post_ffn_norm": ("post_mlp_layernorm", "out"), "residual2": ("", "out")}
OLMO2_PLACES = {"attn": ("self_attn", "out"), "attn_weights": ("self_attn", "weights"),
                "norm1": ("post_attention_layernorm", "out"), "residual1": ("mlp", "in"), "ffn": ("mlp", "out"),
                "norm2": ("post_feedforward_layernorm", "out"), "residual2": ("", "out")}
NEOX_PLACES = {"norm1": ("input_layernorm", "out"), "attn": ("attention", "out"),
               "attn_weights": ("attention", "weights"), "norm2": ("post_attention_layernorm", "out"),
               "ffn": ("mlp", "out"), "residual2": ("", "out")}
LLAMA4_PLACES = {**LLAMA_PLACES, "ffn": ("feed_forward", "out")}
COHERE_PLACES = {"norm1": ("input_layernorm", "out"), "attn": ("self_attn", "out"),
                 "attn_weights": ("self_attn", "weights"), "ffn": ("mlp", "out"), "residual2": ("", "out")}

FAMILIES = {
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(num_key_value_heads=2, sliding_window=4), LLAMA_PLACES),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(num_key_value_heads=2, use_sliding_window=True,
                                                       sliding_window=4, max_window_layers=1), LLAMA_PLACES),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(num_key_value_heads=2, head_dim=16), LLAMA_PLACES),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(num_key_value_heads=1, head_dim=16), LLAMA_PLACES),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(num_key_value_heads=2, head_dim=8, sliding_window=4,
                                                         query_pre_attn_scalar=12, attn_logit_softcapping=3.0),
               GEMMA2_PLACES),
    # HF's Gemma-2 takes "gelu" as the exact GELU (only Gemma-1 rewrites it to tanh) and null as no cap.
    "gemma2 exact-gelu uncapped": ("Gemma2ForCausalLM", "Gemma2Config", dict(
        num_key_value_heads=2, head_dim=8, sliding_window=4, query_pre_attn_scalar=12, attn_logit_softcapping=None,
        hidden_activation="gelu"), GEMMA2_PLACES),
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(rope_parameters={"rope_type": "default",
                 "rope_theta": 500.0, "partial_rotary_factor": 0.5}), NEOX_PLACES),
    "gpt_neox sequential": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(use_parallel_residual=False), NEOX_PLACES),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", dict(num_key_value_heads=2, sliding_window=5, pad_token_id=0,
                                                   eos_token_id=1, bos_token_id=1), LLAMA_PLACES),
    # Gemma-3: a sliding layer between two global ones, whose RoPE is scaled (linear ×2 at theta 1M).
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        num_key_value_heads=2, head_dim=8, sliding_window=4, query_pre_attn_scalar=12,
        layer_types=["full_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}), GEMMA2_PLACES),
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", dict(num_key_value_heads=2), OLMO2_PLACES),
    # StarCoder2: Llama's key names on a LayerNorm block with biases and a two-matrix tanh-GELU MLP, every layer
    # windowed; the family added in one file (sources/families/starcoder2.py) and these rows.
    "starcoder2": ("Starcoder2ForCausalLM", "Starcoder2Config", dict(num_key_value_heads=2, sliding_window=4),
                   LLAMA_PLACES),
    # Mixtures of experts: 4 experts, top-2; Qwen2-MoE with its shared expert and a dense layer between sparse ones.
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", dict(num_key_value_heads=2, num_local_experts=4,
                                                           num_experts_per_tok=2), LLAMA_PLACES),
    "qwen2_moe": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(
        num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
        shared_expert_intermediate_size=40, mlp_only_layers=[1]), LLAMA_PLACES),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(
        num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
        norm_topk_prob=True), LLAMA_PLACES),
    "olmoe": ("OlmoeForCausalLM", "OlmoeConfig", dict(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                                      pad_token_id=0, eos_token_id=1), LLAMA_PLACES),
    # RoPE scaled past the trained context, in the families that ship it; 9 tokens pass each original context.
    "llama rope-llama3": ("LlamaForCausalLM", "LlamaConfig", dict(num_key_value_heads=2, rope_parameters={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16, "rope_theta": 500.0}), LLAMA_PLACES),
    "llama rope-dynamic": ("LlamaForCausalLM", "LlamaConfig", dict(max_position_embeddings=6, rope_parameters={
        "rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}), LLAMA_PLACES),
    "qwen2 rope-yarn": ("Qwen2ForCausalLM", "Qwen2Config", dict(num_key_value_heads=2, rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4, "rope_theta": 10000.0}),
        LLAMA_PLACES),
    # Phi-4-mini: a quarter of each head left unrotated, its partial_rotary_factor at the top level of config.json
    # (the hub's file, and what transformers 5's save_pretrained writes) — refused before, wrongly
    "phi3 partial-rotary": ("Phi3ForCausalLM", "Phi3Config", dict(num_key_value_heads=2, partial_rotary_factor=0.75,
                                                                  pad_token_id=0, eos_token_id=1, bos_token_id=1),
                            LLAMA_PLACES),
    # Granite: Llama's block with four multipliers (embedding, attention, each residual update, logits).
    "granite": ("GraniteForCausalLM", "GraniteConfig", dict(num_key_value_heads=2, embedding_multiplier=6.0,
                attention_multiplier=0.2, residual_multiplier=0.3, logits_scaling=4.0), LLAMA_PLACES),
    # SmolLM3: layer 1 without RoPE, and (use_sliding_window) windowed, as its config class marks NoPE layers.
    "smollm3": ("SmolLM3ForCausalLM", "SmolLM3Config", dict(num_key_value_heads=2, no_rope_layers=[1, 0, 1],
                pad_token_id=0, bos_token_id=1, eos_token_id=1,
                use_sliding_window=True, sliding_window=4), LLAMA_PLACES),
    # OLMo-3: OLMo-2's block, a global layer between sliding ones, the global layers' RoPE scaled (linear ×2).
    "olmo3": ("Olmo3ForCausalLM", "Olmo3Config", dict(
        num_key_value_heads=2, sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 5e5}}), OLMO2_PLACES),
    # EXAONE-4: reordered norms, QK-norm per head; its global layer (1) has no RoPE, its sliding ones do.
    "exaone4": ("Exaone4ForCausalLM", "Exaone4Config", dict(num_key_value_heads=2, sliding_window=4, pad_token_id=0,
                                                           sliding_window_pattern=2), OLMO2_PLACES),
    # Cohere: one LayerNorm (no shift) for both parallel sublayers, interleaved RoPE, biases on attention.
    "cohere": ("CohereForCausalLM", "CohereConfig", dict(num_key_value_heads=2, attention_bias=True, logit_scale=0.5,
                                                         pad_token_id=0, bos_token_id=1, eos_token_id=1), COHERE_PLACES),
    # Cohere-2: sliding layers with RoPE, its global layer (1) without.
    "cohere2": ("Cohere2ForCausalLM", "Cohere2Config", dict(num_key_value_heads=2, sliding_window=4,
                layer_types=["sliding_attention", "full_attention", "sliding_attention"], pad_token_id=0,
                bos_token_id=1, eos_token_id=1), COHERE_PLACES),
    # gpt-oss: attention sinks, a biased router, clamped SwiGLU experts stored fused; YaRN past its context.
    "gpt_oss": ("GptOssForCausalLM", "GptOssConfig", dict(
        num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], pad_token_id=0, eos_token_id=1,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 4, "rope_theta": 10000.0}), LLAMA_PLACES),
    **{name: (config_class.replace("Config", "ForCausalLM"), config_class, extra, LLAMA_PLACES)
       for name, (config_class, extra) in DEEPSEEK.items()},
    # Llama-4: chunked RoPE layers with the L2 QK-norm, a NoPE layer with its query temperature, top-1 experts that
    # scale their input, a shared expert; top-2 too.
    "llama4_text": ("Llama4ForCausalLM", "Llama4TextConfig", dict(**LLAMA4, num_experts_per_tok=1), LLAMA4_PLACES),
    "llama4_text top-2": ("Llama4ForCausalLM", "Llama4TextConfig", dict(**LLAMA4, num_experts_per_tok=2),
                          LLAMA4_PLACES),
    # Ministral: Mistral's block, the window layer by layer (layer_types), every layer sliding without them.
    # (HF's MinistralConfig leaves head_dim None, which its attention cannot use: Ministral's configs give it)
    "ministral": ("MinistralForCausalLM", "MinistralConfig", dict(num_key_value_heads=2, head_dim=16, sliding_window=4,
                  layer_types=["sliding_attention", "full_attention", "sliding_attention"]), LLAMA_PLACES),
    "ministral every layer sliding": ("MinistralForCausalLM", "MinistralConfig", dict(num_key_value_heads=2,
                                      head_dim=8, sliding_window=4), LLAMA_PLACES),
    # Seed-OSS: biases on q/k/v, on the output projection and on the MLP, each its own key; head_dim ≠ d / heads.
    "seed_oss": ("SeedOssForCausalLM", "SeedOssConfig", dict(num_key_value_heads=2, head_dim=16, attention_bias=True,
                                                           attention_out_bias=True, mlp_bias=True), LLAMA_PLACES),
    "seed_oss default biases": ("SeedOssForCausalLM", "SeedOssConfig", dict(num_key_value_heads=2), LLAMA_PLACES),
    # ERNIE-4.5: interleaved RoPE, one use_bias for every linear layer, head_dim ≠ d / heads, a tied head.
    "ernie4_5": ("Ernie4_5ForCausalLM", "Ernie4_5Config", dict(num_key_value_heads=2, head_dim=16, use_bias=True),
                 LLAMA_PLACES),
    # GLM-4.5: DeepSeek-V3's experts (layer 0 dense) under grouped-query attention with q/k/v biases, QK-norm, half
    # the dims rotated.
    "glm4_moe": ("Glm4MoeForCausalLM", "Glm4MoeConfig", dict(
        num_key_value_heads=2, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
        topk_group=1, first_k_dense_replace=1, routed_scaling_factor=1.5, attention_bias=True, use_qk_norm=True),
        LLAMA_PLACES),
    # MiniMax-M2: Mixtral's keys, a biased sigmoid router, QK-norm over all heads, a quarter of each head rotated.
    "minimax_m2": ("MiniMaxM2ForCausalLM", "MiniMaxM2Config", dict(
        num_key_value_heads=2, head_dim=16, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2,
        rotary_dim=4, bos_token_id=1, eos_token_id=1), LLAMA_PLACES),
    # ERNIE-4.5 MoE: ERNIE's attention; experts chosen by softmax + a bias, two shared experts, layer 0 dense.
    "ernie4_5_moe": ("Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeConfig", dict(
        num_key_value_heads=2, head_dim=16, moe_intermediate_size=16, moe_k=2, moe_num_experts=4,
        moe_num_shared_experts=2, moe_layer_start_index=1), LLAMA_PLACES),
    # Hunyuan dense: QK-norm per head after RoPE; "dynamic" RoPE with a fixed alpha (a stretched base); biases.
    "hunyuan_v1_dense": ("HunYuanDenseV1ForCausalLM", "HunYuanDenseV1Config", dict(
        num_key_value_heads=2, head_dim=8, attention_bias=True, rope_parameters={
            "rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}), LLAMA_PLACES),
    # Apertus: QK-norm per head, an ungated MLP with xIELU (two learned scalars per layer), llama3 RoPE at 12M.
    "apertus": ("ApertusForCausalLM", "ApertusConfig", dict(num_key_value_heads=2), APERTUS_PLACES),
    # Helium: interleaved RoPE, float32 norm gains, biases on q/k/v and the MLP (none on o_proj).
    "helium": ("HeliumForCausalLM", "HeliumConfig", dict(num_key_value_heads=2, head_dim=8, attention_bias=True,
                                                         mlp_bias=True), LLAMA_PLACES),
    # Arcee: Llama's attention with an ungated ReLU² MLP, biases on both.
    "arcee": ("ArceeForCausalLM", "ArceeConfig", dict(num_key_value_heads=2, attention_bias=True, mlp_bias=True),
              LLAMA_PLACES),
    # GLM-4 dense: four norms per layer, fused gate_up_proj, q/k/v biases, interleaved RoPE on half of each head.
    "glm4": ("Glm4ForCausalLM", "Glm4Config", dict(num_key_value_heads=2, head_dim=8, pad_token_id=0, eos_token_id=1),
             GLM4_PLACES),
    # dots.llm1: Qwen3's attention (QK-norm, biases on all four) over DeepSeek-V3's experts; its last layer slides.
    "dots1": ("Dots1ForCausalLM", "Dots1Config", dict(
        num_key_value_heads=2, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        n_group=2, topk_group=1, first_k_dense_replace=1, routed_scaling_factor=1.5, norm_topk_prob=True,
        attention_bias=True, sliding_window=4, max_window_layers=2), LLAMA_PLACES),
    # EXAONE-MoE: EXAONE-4's attention (QK-norm, sliding layers, a NoPE global one) in a Pre-LN layer over DeepSeek-V3's
    # experts after a dense layer, the choice bias kept as mlp.e_score_correction_bias.
    "exaone_moe": ("ExaoneMoeForCausalLM", "ExaoneMoeConfig", dict(
        num_key_value_heads=2, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2, num_shared_experts=1,
        first_k_dense_replace=1, sliding_window=4, sliding_window_pattern=3, routed_scaling_factor=1.5, n_group=2,
        topk_group=1), LLAMA_PLACES),
    # Hunyuan-MoE: Hunyuan's attention with experts in every layer and one shared MLP, the router as mlp.gate.wg.
    "hunyuan_v1_moe": ("HunYuanMoEV1ForCausalLM", "HunYuanMoEV1Config", dict(
        num_key_value_heads=2, head_dim=8, attention_bias=True, num_experts=4, moe_topk=2), LLAMA_PLACES),
    "phi3 rope-longrope": ("Phi3ForCausalLM", "Phi3Config", dict(
        original_max_position_embeddings=4, pad_token_id=0, eos_token_id=1, bos_token_id=1,
        rope_parameters={"rope_type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3],
                         "long_factor": [1.0, 2.0, 4.0, 8.0], "rope_theta": 10000.0}), LLAMA_PLACES),
}


def build(name: str, randomised: bool = True):
    """The family's HF model: every parameter randomised large (weights std 0.15, norm gains 1 ± 0.3, biases), or
    as HF initialises it (std 0.02, gains 1)."""
    import transformers

    model_class, config_class, extra, places = FAMILIES[name]
    config = getattr(transformers, config_class)(**{**SMALL, **extra})
    torch.manual_seed(sum(map(ord, name)))
    model = getattr(transformers, model_class)(config).eval()
    if randomised:
        randomise_hf(model, seed=sum(map(ord, name)))
        randomise_choice_bias(model, seed=sum(map(ord, name)))
    return model, places



def layers_of(model):
    base = model.gpt_neox if hasattr(model, "gpt_neox") else model.model
    return base, base.layers


def reference(model, places: dict, layer: int, ids: list[int]) -> dict:
    base, layers = layers_of(model)
    block = layers[layer]
    seen = capture(model, {name: (block.get_submodule(path) if path else block, where)
                           for name, (path, where) in places.items()}, ids)
    if seen["ffn"].shape != seen["hidden_states"][layer].shape:  # Llama-4's experts return [B·T, d]
        seen["ffn"] = seen["ffn"].reshape(seen["hidden_states"][layer].shape)
    if "residual1" not in seen:  # a parallel residual never forms x + attn_out: it is the sum of HF's own values
        seen["residual1"] = seen["hidden_states"][layer] + seen["attn"]
    return seen


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    model, places = build(request.param)
    directory = tmp_path_factory.mktemp(request.param.replace(" ", "_"))
    model.save_pretrained(directory)
    return request.param, directory, model, places


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_every_step_matches_huggingface(family, layer):
    name, directory, model, places = family
    expected = reference(model, places, layer, IDS)
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    assert info.family_name == name.split()[0]
    block = load_block(checkpoint, info, layer, checkpoint_config(checkpoint, info, {}))
    traced = trace(block, expected["hidden_states"][layer][0], keep_tensors=True).tensors()
    for step in (*places, "residual1"):
        delta = (traced[step] - expected[step][0]).abs().max().item()
        assert delta <= 1e-5, f"{name} layer {layer} {step}: max |Δ| {delta}"


NEWER = ["gemma3", "olmo2", "starcoder2", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "llama rope-llama3", "llama rope-dynamic",
         "qwen2 rope-yarn", "phi3 rope-longrope", "phi3 partial-rotary", "granite", "smollm3", "olmo3", "exaone4",
         "cohere", "cohere2", "gpt_oss", "deepseek_v3", "deepseek_v2", "deepseek_v2 greedy",
         "llama4_text", "llama4_text top-2", "seed_oss", "ernie4_5", "glm4_moe", "minimax_m2", "ernie4_5_moe",
         "hunyuan_v1_dense", "apertus", "helium", "arcee", "glm4", "dots1", "exaone_moe", "hunyuan_v1_moe", "ministral"]


@pytest.mark.parametrize("name", NEWER)
def test_at_huggingfaces_own_initialisation_too(name, tmp_path):
    """The small-weight side: the model as HF initialises it, its last layer, every step."""
    model, places = build(name, randomised=False)
    model.save_pretrained(tmp_path)
    expected = reference(model, places, 2, IDS)
    checkpoint = Checkpoint(tmp_path)
    info = model_info(checkpoint)
    block = load_block(checkpoint, info, 2, checkpoint_config(checkpoint, info, {}))
    traced = trace(block, expected["hidden_states"][2][0], keep_tensors=True).tensors()
    for step in (*places, "residual1"):
        delta = (traced[step] - expected[step][0]).abs().max().item()
        assert delta <= 1e-5, f"{name} {step}: max |Δ| {delta}"


def test_token_ids_give_the_input_huggingface_feeds_each_block(family):
    name, directory, model, places = family
    hidden = reference(model, places, 0, IDS)["hidden_states"]
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    config = checkpoint_config(checkpoint, info, {})
    embedded = embed_token_ids(checkpoint, info, IDS)
    for layer in range(3):
        x = hidden_state_before(checkpoint, info, config, embedded, layer)
        assert (x - hidden[layer][0]).abs().max().item() <= 1e-5, (name, layer)


def test_the_hf_layer_traced_bare_equals_itself_inside_its_model(family):
    """Called the way its model calls it: causal mask (with the sliding window), positions, rotary."""
    name, _, model, places = family
    layer = 2
    expected = reference(model, places, layer, IDS)
    _, layers = layers_of(model)
    for x in (expected["hidden_states"][layer][0], expected["hidden_states"][layer]):  # unbatched, batched
        traced = trace(layers[layer], x, keep_tensors=True, checks=True)
        ours = traced.tensors()
        for step in (*places, "residual1"):
            delta = (ours[step].reshape(expected[step].shape) - expected[step]).abs().max().item()
            assert delta <= 1e-5, f"{name} {step}: max |Δ| {delta}"
        assert traced.expected_causal is True and traced.attention.future_weight_sum == 0.0
        assert traced.step("attn").probe.causal.causal is True


def test_qk_norm_is_a_traced_substep(tmp_path):
    model, places = build("qwen3")
    model.save_pretrained(tmp_path)
    base, layers = layers_of(model)
    seen = capture(model, {"q_norm": (layers[1].self_attn.q_norm, "out"), "k_norm": (layers[1].self_attn.k_norm, "out")},
                   IDS)
    checkpoint = Checkpoint(tmp_path)
    info = model_info(checkpoint)
    block = load_block(checkpoint, info, 1, checkpoint_config(checkpoint, info, {}))
    traced = trace(block, seen["hidden_states"][1][0], keep_tensors=True)
    assert [s.name for s in traced.substeps] == ["attn.q", "attn.q_norm", "attn.q_rope", "attn.k", "attn.k_norm",
                                                 "attn.k_rope"]
    tensors = traced.tensors()
    for name in ("q_norm", "k_norm"):  # HF: [B, T, H, hd]; ours: [H, T, hd]
        assert (tensors[f"attn.{name}"] - seen[name][0].transpose(0, 1)).abs().max() <= 1e-5, name


def _retyped(tmp_path, name: str, model_type: str):
    model, _ = build(name)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["model_type"] = model_type
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("name, leftover", [("qwen2", "self_attn.q_proj.bias"), ("qwen3", "self_attn.k_norm.weight"),
                                            ("gemma2", "post_feedforward_layernorm.weight")])
def test_a_checkpoint_read_as_llama_is_refused_by_its_tensors(tmp_path, name, leftover):
    """Were config.json to say llama, the tensors Llama does not have still refuse the trace."""
    checkpoint = Checkpoint(_retyped(tmp_path, name, "llama"))
    info = model_info(checkpoint)
    with pytest.raises(WeightsError, match=f"does not use: .*{leftover}"):
        load_block(checkpoint, info, 0, checkpoint_config(checkpoint, info, {}))


def test_unknown_model_types_and_llama_keys_without_config_are_refused(invoke, tmp_path):
    target = _retyped(tmp_path / "llama4", "qwen3", "llama4")  # the multimodal model's type
    result = invoke("run", "--weights", str(target), "--token-ids", "1", "2")
    assert result.exit_code == 2 and "model_type 'llama4' is not supported" in result.stderr
    bare = tmp_path / "bare"
    model, _ = build("mistral")
    model.save_pretrained(bare)
    (bare / "config.json").unlink()
    result = invoke("run", "--weights", str(bare), "--token-ids", "1", "2", "--heads", "4")
    assert result.exit_code == 2 and "has no config.json" in result.stderr and "add the checkpoint's config.json" \
        in result.stderr


@pytest.mark.parametrize("name, change, message", [
    ("gemma", {"quantization_config": {"quant_method": "gptq"}}, "quantised weights are not supported"),
    ("gemma", {"rope_parameters": {"rope_type": "proportional", "rope_theta": 1e4}},
     "rope type 'proportional' is not supported"),
    ("gemma", {"use_bidirectional_attention": True}, "use_bidirectional_attention = True"),
    ("starcoder2", {"use_bias": False}, "use_bias = False drops the linear biases but keeps LayerNorm's shift"),
    ("cohere", {"use_qk_norm": True}, "use_qk_norm = True adds a LayerNorm per head on q and k"),
    ("cohere2", {"head_dim": 4}, "head_dim must be hidden_size / num_attention_heads = 8"),
    ("deepseek_v3", {"quantization_config": {"quant_method": "fp8"}}, "quantised weights are not supported"),
    ("deepseek_v3", {"scoring_func": "softmax"}, "scoring_func = 'softmax' scores the experts otherwise"),
    ("deepseek_v3", {"moe_layer_freq": 2}, "moe_layer_freq = 2 makes only some layers"),
    ("deepseek_v3", {"num_key_value_heads": 2}, "latent attention gives every head its own key and value"),
    ("deepseek_v2", {"topk_method": "noaux_tc"}, "greedy or group_limited_greedy"),
    ("deepseek_v2", {"mlp_bias": True}, "mlp_bias = True puts biases on the dense MLPs"),
    ("llama4_text", {"layer_types": ["sliding_attention", "full_attention", "chunked_attention"]},
     "full_attention or chunked_attention (Llama-4 has no sliding layers)"),
    ("llama4_text", {"layer_types": ["full_attention", "chunked_attention", "local"]},
     "made of full_attention and sliding_attention and chunked_attention"),
    ("llama4_text", {"no_rope_layers": [1, 2, 1]}, "1 (RoPE) or 0 (none), one per layer"),
    ("llama4_text", {"moe_layers": [5]}, "a list of layer indices below 3"),
    ("gemma2", {"layer_types": ["chunked_attention", "full_attention", "full_attention"]},
     "made of full_attention and sliding_attention (blocktrace traces no other kind here)"),
    ("helium", {"head_dim": 16}, "head_dim must be hidden_size / num_attention_heads = 8 (Helium's o_proj"),
    ("apertus", {"hidden_act": "silu"}, "hidden_act 'silu' is not supported for apertus; supported: xielu"),
    ("hunyuan_v1_moe", {"moe_topk": [2, 2, 2]}, "moe_topk must be a positive integer"),
    ("dots1", {"n_shared_experts": None}, "n_shared_experts must be an integer (Dots1Config has no default for it)"),
])
def test_config_fields_blocktrace_does_not_implement_are_refused(invoke, tmp_path, name, change, message):
    model, _ = build(name)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(change)
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = invoke("run", "--weights", str(tmp_path), "--token-ids", "1", "2")
    assert result.exit_code == 2 and message in result.stderr, result.stderr


@pytest.mark.parametrize("name, operations", [
    ("gemma2", ["attn_normed = RMSNorm[1+w](attn_out)", "ffn_normed = RMSNorm[1+w](ffn_out)"]),
    ("gpt_neox", ["x_norm2 = LayerNorm(x)  (parallel: reads x, not x1)", "(= x + attn_out + ffn_out)"]),
])
def test_sandwich_and_parallel_wiring_in_the_table(invoke, tmp_path, name, operations):
    model, _ = build(name)
    model.save_pretrained(tmp_path)
    text = invoke("run", "--weights", str(tmp_path), "--layer", "1", "--token-ids", "1", "2", "3").stdout
    for operation in operations:
        assert operation in text, text


@pytest.mark.parametrize("sample, loader, places", [("gemma2-tiny", "Gemma2ForCausalLM", GEMMA2_PLACES),
                                                    ("neox-tiny", "GPTNeoXForCausalLM", NEOX_PLACES)])
def test_the_samples_load_in_huggingface_and_match(invoke, tmp_path, sample, loader, places):
    import transformers
    from helpers import SAMPLES
    from safetensors.torch import load_file

    model = getattr(transformers, loader).from_pretrained(SAMPLES / sample, attn_implementation="eager").eval()
    ids = [4, 8, 15, 16, 23, 42]
    expected = reference(model, places, 1, ids)
    path = tmp_path / "t.safetensors"
    result = invoke("run", "--weights", str(SAMPLES / sample), "--layer", "1", "--token-ids", *map(str, ids),
                    "--save", str(path))
    assert result.exit_code == 0, result.output
    ours = load_file(str(path))
    assert (ours["x"] - expected["hidden_states"][1][0]).abs().max() <= 1e-5
    for step in (*places, "residual1"):
        assert (ours[step] - expected[step][0]).abs().max() <= 1e-5, step


FAMILY_CONFIGS = [("llama", "LlamaConfig"), ("mistral", "MistralConfig"), ("phi3", "Phi3Config"),
                  ("gemma", "GemmaConfig"), ("gemma2", "Gemma2Config"), ("gemma3", "Gemma3TextConfig"), ("olmo2", "Olmo2Config"),
                  ("mixtral", "MixtralConfig"), ("qwen2_moe", "Qwen2MoeConfig"), ("qwen3_moe", "Qwen3MoeConfig"),
                  ("olmoe", "OlmoeConfig"), ("starcoder2", "Starcoder2Config"),
                  ("deepseek_v3", "DeepseekV3Config"), ("deepseek_v2", "DeepseekV2Config"),
                  ("llama4_text", "Llama4TextConfig"), ("lfm2", "Lfm2Config"), ("seed_oss", "SeedOssConfig"),
                  ("ernie4_5", "Ernie4_5Config"), ("glm4_moe", "Glm4MoeConfig"),
                  ("minimax_m2", "MiniMaxM2Config"), ("qwen3_next", "Qwen3NextConfig"),
                  ("granitemoehybrid", "GraniteMoeHybridConfig"), ("ernie4_5_moe", "Ernie4_5_MoeConfig"),
                  ("hunyuan_v1_dense", "HunYuanDenseV1Config"), ("apertus", "ApertusConfig"), ("helium", "HeliumConfig"), ("arcee", "ArceeConfig"), ("glm4", "Glm4Config"), ("dots1", "Dots1Config"), ("exaone_moe", "ExaoneMoeConfig"),
                  ("hunyuan_v1_moe", "HunYuanMoEV1Config"), ("ministral", "MinistralConfig")]
# Defaults transformers 5 keeps elsewhere than under their config.json key.
HF_DEFAULT_PLACES = {"rope_theta": lambda hf: hf.rope_parameters["full_attention"]["rope_theta"],
                     "rope_local_base_freq": lambda hf: hf.rope_parameters["sliding_attention"]["rope_theta"],
                     "sliding_window_pattern": lambda hf: hf._sliding_window_pattern}


@pytest.mark.parametrize("name, config_class", FAMILY_CONFIGS)
def test_each_familys_defaults_are_huggingfaces_own(name, config_class):
    """A key missing from config.json takes the family's HF default (once: Llama's for all, so Phi-3 got eps 1e-6
    and Mistral no window)."""
    import transformers

    from blocktrace.sources.families import FAMILIES as READERS

    hf = getattr(transformers, config_class)()
    family = READERS[name]
    assert family.defaults
    for key, value in family.defaults.items():
        held = HF_DEFAULT_PLACES[key](hf) if key in HF_DEFAULT_PLACES and name == "gemma3" else getattr(hf, key)
        assert held == value, (name, key)


@pytest.mark.parametrize("name, key, field, expected", [("phi3", "rms_norm_eps", "eps", 1e-5),
                                                        ("mistral", "sliding_window", "sliding_window", 4096)])
def test_a_missing_key_takes_the_familys_default_and_says_so(invoke, tmp_path, name, key, field, expected):
    model, _ = build(name)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop(key)
    (tmp_path / "config.json").write_text(json.dumps(config))
    checkpoint = Checkpoint(tmp_path)
    info = model_info(checkpoint)
    read = checkpoint_config(checkpoint, info, {})
    layer = load_block(checkpoint, info, 0, read).config
    assert getattr(read if field == "eps" else layer, field) == expected
    assert f"config.json has no {key}: {name}'s default {expected} assumed" in " ".join(info.notes)


def test_phi4_minis_top_level_partial_rotary_factor_is_read_as_hf_reads_it(tmp_path):
    """The hub's Phi-4-mini config.json gives partial_rotary_factor at the top level only: HF folds it into its rope
    parameters; blocktrace reads it there too (it refused the file before)."""
    model, places = build("phi3 partial-rotary")
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    written["rope_parameters"].pop("partial_rotary_factor")
    (tmp_path / "config.json").write_text(json.dumps(written))
    checkpoint = Checkpoint(tmp_path)
    info = model_info(checkpoint)
    config = checkpoint_config(checkpoint, info, {})
    assert config.rotary_fraction == 0.75
    expected = reference(model, places, 1, IDS)
    traced = trace(load_block(checkpoint, info, 1, config), expected["hidden_states"][1][0], keep_tensors=True).tensors()
    for step in places:
        assert (traced[step] - expected[step][0]).abs().max().item() <= 1e-5, step


@pytest.mark.parametrize("source", ["hf", "ours"])
def test_granites_residual_identity_holds_with_its_multiplier(tmp_path, source):
    """The residual probe checks x1 = x + m·attn_out with Granite's m, for HF's own layer traced bare and for
    blocktrace's block: a probe that assumed m = 1 would report a mismatch of about 1 − m."""
    model, places = build("granite")
    x = reference(model, places, 1, IDS)["hidden_states"][1][0]
    if source == "hf":
        block = layers_of(model)[1][1]
    else:
        model.save_pretrained(tmp_path)
        checkpoint = Checkpoint(tmp_path)
        info = model_info(checkpoint)
        block = load_block(checkpoint, info, 1, checkpoint_config(checkpoint, info, {}))
    traced = trace(block, x, checks=True)
    for step in ("residual1", "residual2"):
        assert traced.step(step).probe.residual_mismatch < 1e-6, step


def test_latent_attentions_compressed_query_and_keys_are_traced_substeps(invoke, tmp_path):
    """MLA's pieces named in the table: the query latent and the key/value latent (what a cache keeps) equal HF's
    q_a_layernorm and kv_a_layernorm outputs, the query heads HF's q_b_proj split into heads; the header says the
    latent widths and the router (the attention and every step are compared above)."""
    model, _ = build("deepseek_v3")
    model.save_pretrained(tmp_path)
    attention = model.model.layers[1].self_attn
    seen = capture(model, {"q_latent": (attention.q_a_layernorm, "out"), "kv_latent": (attention.kv_a_layernorm, "out"),
                           "q_b": (attention.q_b_proj, "out")}, IDS)
    checkpoint = Checkpoint(tmp_path)
    info = model_info(checkpoint)
    block = load_block(checkpoint, info, 1, checkpoint_config(checkpoint, info, {}))
    traced = trace(block, seen["hidden_states"][1][0], keep_tensors=True)
    assert [s.name for s in traced.substeps if s.name.startswith("attn.")] == [
        "attn.q_latent", "attn.q", "attn.kv_latent", "attn.k", "attn.q_rope", "attn.k_rope"]
    tensors = traced.tensors()
    for name in ("q_latent", "kv_latent"):
        assert (tensors[f"attn.{name}"] - seen[name][0]).abs().max() <= 1e-5, name
    q = seen["q_b"][0].view(len(IDS), 4, 16).transpose(0, 1)  # HF's q heads, [H, T, 8 + 8]
    assert (tensors["attn.q"] - q).abs().max() <= 1e-5
    text = invoke("run", "--weights", str(tmp_path), "--token-ids", *map(str, IDS), "--layer", "1").stdout
    assert "latent='q latent 24, kv latent 16, q·k 8+8 rope, v 12'" in text and "router=sigmoid_grouped" in text
    assert "expert_groups=4 groups_per_token=2 routed_scaling=1.7 choice_bias=True" in text
    assert "attn_out = MultiHeadAttention[latent](x_norm1)" in text


def test_ernies_choice_bias_moves_the_experts_chosen_and_is_read(tmp_path):
    """The bias only moves the choice: zeroed, HF's FFN output changes; ours follows HF's either way."""
    model, places = build("ernie4_5_moe")
    with_bias = reference(model, places, 1, IDS)["ffn"]
    with torch.no_grad():
        for layer in model.model.layers[1:]:
            layer.mlp.gate.moe_statics.e_score_correction_bias.zero_()
    without = reference(model, places, 1, IDS)
    assert (with_bias - without["ffn"]).abs().max().item() > 1e-3
    model.save_pretrained(tmp_path)
    checkpoint = Checkpoint(tmp_path)
    info = model_info(checkpoint)
    block = load_block(checkpoint, info, 1, checkpoint_config(checkpoint, info, {}))
    traced = trace(block, without["hidden_states"][1][0], keep_tensors=True).tensors()
    assert (traced["ffn"] - without["ffn"][0]).abs().max().item() <= 1e-5


def test_xielu_is_the_papers_formula():
    """xIELU against its definition (Huang & Schlag 2024, eq. 5), evaluated in float64 by hand on both branches."""
    import math

    from blocktrace.model.layers import XIELU

    act = XIELU().double()
    with torch.no_grad():
        act.alpha_p.fill_(0.3)
        act.alpha_n.fill_(-0.4)
    softplus = lambda v: math.log1p(math.exp(v))  # noqa: E731
    alpha_p, alpha_n, beta = softplus(0.3), 0.5 + softplus(-0.4), 0.5
    eps = act.eps.item()  # -1e-6 as the checkpoint's float32 tensor holds it
    for x in (-6.0, -1.0, -1e-7, 0.0, 0.5, 3.0):
        expected = alpha_p * x * x + beta * x if x > 0 else (math.expm1(min(x, eps)) - x) * alpha_n + beta * x
        assert act(torch.tensor([x], dtype=torch.float64)).item() == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_apertus_reads_xielus_constants_from_the_checkpoint(tmp_path):
    """β and ε are tensors of the file: changed there, HF's FFN output changes and ours follows it."""
    model, places = build("apertus")
    before = reference(model, places, 1, IDS)["ffn"]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.act_fn.beta.fill_(0.2)
            layer.mlp.act_fn.eps.fill_(-0.5)
    after = reference(model, places, 1, IDS)
    assert (before - after["ffn"]).abs().max().item() > 1e-3
    model.save_pretrained(tmp_path)
    checkpoint = Checkpoint(tmp_path)
    info = model_info(checkpoint)
    block = load_block(checkpoint, info, 1, checkpoint_config(checkpoint, info, {}))
    traced = trace(block, after["hidden_states"][1][0], keep_tensors=True).tensors()
    assert (traced["ffn"] - after["ffn"][0]).abs().max().item() <= 1e-5


def test_an_mlp_checkpoint_with_xielu_asked_for_is_refused(invoke):
    """GPT-2's file has no xIELU scalars: --ffn xielu is refused by name, not filled with their initial values."""
    from pathlib import Path

    sample = Path(__file__).resolve().parents[1] / "sample_weights" / "gpt2-tiny"
    result = invoke("run", "--weights", str(sample), "--ffn", "xielu", "--token-ids", "1", "2", "3")
    assert result.exit_code == 2
    assert "Error: GPT-2 weights need" in result.output and "gelu, gelu_tanh, relu or relu2" in result.output


@pytest.mark.parametrize("name", ["exaone4", "exaone_moe"])
def test_a_global_layer_of_a_model_that_keeps_its_window_everywhere_is_traced_without_it(name):
    """EXAONE-4's attention keeps the config's sliding_window on every layer and flags the sliding ones (is_sliding):
    its global layer (NoPE, the whole context) traced bare got the window's mask (max |Δ| ~1 in attn) until the
    caller read the flag."""
    model, places = build(name)
    layer = next(k for k, block in enumerate(layers_of(model)[1]) if block.self_attn.is_sliding is False)
    expected = reference(model, places, layer, IDS)
    traced = trace(layers_of(model)[1][layer], expected["hidden_states"][layer], keep_tensors=True).tensors()
    for step in places:
        delta = (traced[step].reshape(expected[step].shape) - expected[step]).abs().max().item()
        assert delta <= 1e-5, f"{name} layer {layer} {step}: max |Δ| {delta}"


def test_hunyuan_moe_files_keys_hf_does_not_read_are_said(tmp_path):
    """Tencent's own files carry moe_intermediate_size and num_shared_expert; HF's HunYuanMoEV1 sizes everything by
    intermediate_size: read as HF reads it, and said."""
    model, _ = build("hunyuan_v1_moe")
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(moe_intermediate_size=8, num_shared_expert=1)
    (tmp_path / "config.json").write_text(json.dumps(config))
    checkpoint = Checkpoint(tmp_path)
    info = model_info(checkpoint)
    assert any(note.startswith("moe_intermediate_size, num_shared_expert in config.json not read") for note in info.notes)
    block = load_block(checkpoint, info, 0, checkpoint_config(checkpoint, info, {}))
    assert block.config.d_ff == block.config.experts.shared_expert_d_ff == 64


def test_a_ministral_config_without_head_dim_is_read_with_the_assumption_said(tmp_path):
    """HF's MinistralConfig leaves head_dim unset and its attention cannot run so (None ** -0.5); Ministral's own
    configs give it. Without it blocktrace takes hidden_size / num_attention_heads — Mistral's rule — and says so."""
    path = _retyped(tmp_path, "mistral", "ministral")
    config = json.loads((path / "config.json").read_text())
    config.pop("head_dim", None)
    (path / "config.json").write_text(json.dumps(config))
    checkpoint = Checkpoint(path)
    info = model_info(checkpoint)
    assert info.family.name == "ministral"
    assert any("config.json has no head_dim: hidden_size / num_attention_heads assumed" in note
               for note in info.family.notes(info.config))
    mistral = build("mistral")[0]  # the same weights read as Mistral: the same layer
    expected = reference(mistral, LLAMA_PLACES, 1, IDS)
    block = load_block(checkpoint, info, 1, checkpoint_config(checkpoint, info, {}))
    traced = trace(block, expected["hidden_states"][1][0], keep_tensors=True).tensors()
    assert (traced["residual2"] - expected["residual2"][0]).abs().max() <= 1e-5
