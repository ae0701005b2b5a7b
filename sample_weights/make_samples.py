"""Regenerate the sample checkpoints in this folder, byte for byte.

    python sample_weights/make_samples.py [OUTPUT_DIR]

gemma2-tiny/: Gemma-2's keys and config (four norms per layer, soft-capped logits, a sliding window
on layer 0), 2 layers. neox-tiny/: GPT-NeoX's keys and a Pythia-style config (fused qkv, rotary on
a quarter of each head, parallel residual), 2 layers.
gpt2-tiny/: a GPT-2-layout model (keys as GPT2Model saves them: h.{k}.*, wte, wpe, ln_f),
4 layers, d_model 64, 4 heads, d_ff 256, 128 positions, gelu_new.
bert-tiny/: a BERT-layout model (keys as BertModel saves them), Post-LN, exact GELU, eps 1e-12.
llama-tiny/: a Llama-layout model (keys as LlamaForCausalLM saves them: model.layers.{k}.*),
RMSNorm, SwiGLU (d_ff 172), RoPE θ 10000, 4 query heads of 16 over 2 key/value heads.
Each comes with the same word-level tokenizer.json of 118 entries. Every parameter is random (weights, biases, LayerNorm gains
and shifts), so a missing transpose or a dropped bias cannot hide. The numbers mean
nothing: they exist to exercise loading and tracing.

traces/: two `--save` trace files of gpt2-tiny's layer 1, for the `blocktrace diff` example.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

SEED = 2024
D_MODEL, N_HEAD, N_LAYER, N_POSITIONS = 64, 4, 4, 128
WORDS = (
    "[UNK] 猫 吃 鱼 狗 喝 水 我 你 他 的 了 是 在 有 一 个 苹果 红红的 手机 "
    "the a an cat dog fish eats drinks water i you he she it is are was were has have "
    "and or but not no yes in on at to of for with from by as this that these those "
    "big small red green blue old new good bad fast slow hot cold happy sad one two three "
    "four five six seven eight nine ten apple phone book tree house car sun moon star sky "
    "sea river road city day night time year people man woman child world life hand eye "
    "head word line . , ! ?"
).split()


def gpt2_tensors(vocab_size: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED)

    def normal(*shape, mean=0.0, std=0.1):
        return mean + std * torch.randn(*shape, generator=generator)

    d, f = D_MODEL, 4 * D_MODEL
    tensors = {"wte.weight": normal(vocab_size, d, std=0.5), "wpe.weight": normal(N_POSITIONS, d, std=0.2)}
    for k in range(N_LAYER):
        layer = {
            "ln_1.weight": normal(d, mean=1.0, std=0.2), "ln_1.bias": normal(d, std=0.1),
            "attn.c_attn.weight": normal(d, 3 * d, std=0.15), "attn.c_attn.bias": normal(3 * d, std=0.1),
            "attn.c_proj.weight": normal(d, d, std=0.1), "attn.c_proj.bias": normal(d, std=0.05),
            "ln_2.weight": normal(d, mean=1.0, std=0.2), "ln_2.bias": normal(d, std=0.1),
            "mlp.c_fc.weight": normal(d, f, std=0.1), "mlp.c_fc.bias": normal(f, std=0.1),
            "mlp.c_proj.weight": normal(f, d, std=0.05), "mlp.c_proj.bias": normal(d, std=0.05),
        }
        tensors.update({f"h.{k}.{name}": value for name, value in layer.items()})
    tensors["ln_f.weight"] = normal(d, mean=1.0, std=0.2)
    tensors["ln_f.bias"] = normal(d, std=0.1)
    return tensors


def gpt2_config(vocab_size: int) -> dict:
    return {
        "model_type": "gpt2", "architectures": ["GPT2Model"], "activation_function": "gelu_new",
        "n_embd": D_MODEL, "n_head": N_HEAD, "n_layer": N_LAYER, "n_positions": N_POSITIONS,
        "n_inner": None, "layer_norm_epsilon": 1e-5, "vocab_size": vocab_size,
        "bos_token_id": 0, "eos_token_id": 0,
    }


def write_tokenizer(path: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {word: index for index, word in enumerate(WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer.save(str(path))
    return len(vocab)


def _normal(generator):
    def normal(*shape, mean=0.0, std=0.1):
        return mean + std * torch.randn(*shape, generator=generator)
    return normal


def bert_tensors(vocab_size: int) -> dict[str, torch.Tensor]:
    """BertModel's keys (embeddings.*, encoder.layer.{k}.*, pooler.*), every parameter random."""
    normal = _normal(torch.Generator().manual_seed(SEED + 1))
    d, f = D_MODEL, 4 * D_MODEL
    tensors = {"embeddings.word_embeddings.weight": normal(vocab_size, d, std=0.5),
               "embeddings.position_embeddings.weight": normal(N_POSITIONS, d, std=0.2),
               "embeddings.token_type_embeddings.weight": normal(2, d, std=0.2),
               "embeddings.LayerNorm.weight": normal(d, mean=1.0, std=0.2), "embeddings.LayerNorm.bias": normal(d)}
    for k in range(N_LAYER):
        base = f"encoder.layer.{k}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            tensors[base + name + ".weight"] = normal(d, d, std=0.15)
            tensors[base + name + ".bias"] = normal(d)
        tensors[base + "intermediate.dense.weight"], tensors[base + "intermediate.dense.bias"] = normal(f, d), normal(f)
        tensors[base + "output.dense.weight"], tensors[base + "output.dense.bias"] = normal(d, f, std=0.05), normal(d)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            tensors[base + norm + ".weight"] = normal(d, mean=1.0, std=0.2)
            tensors[base + norm + ".bias"] = normal(d)
    tensors["pooler.dense.weight"], tensors["pooler.dense.bias"] = normal(d, d), normal(d)
    return tensors


def bert_config(vocab_size: int) -> dict:
    return {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": D_MODEL,
            "num_attention_heads": N_HEAD, "num_hidden_layers": N_LAYER, "intermediate_size": 4 * D_MODEL,
            "hidden_act": "gelu", "layer_norm_eps": 1e-12, "max_position_embeddings": N_POSITIONS,
            "type_vocab_size": 2, "vocab_size": vocab_size, "position_embedding_type": "absolute",
            "pad_token_id": 0}


LLAMA_HEAD_DIM, LLAMA_KV_HEADS, LLAMA_D_FF = 16, 2, 172


def llama_tensors(vocab_size: int) -> dict[str, torch.Tensor]:
    """LlamaForCausalLM's keys (model.layers.{k}.*, model.embed_tokens, model.norm, lm_head)."""
    normal = _normal(torch.Generator().manual_seed(SEED + 2))
    d, f, hd = D_MODEL, LLAMA_D_FF, LLAMA_HEAD_DIM
    tensors = {"model.embed_tokens.weight": normal(vocab_size, d, std=0.5)}
    for k in range(N_LAYER):
        base = f"model.layers.{k}."
        tensors[base + "input_layernorm.weight"] = normal(d, mean=1.0, std=0.2)
        tensors[base + "self_attn.q_proj.weight"] = normal(N_HEAD * hd, d, std=0.15)
        tensors[base + "self_attn.k_proj.weight"] = normal(LLAMA_KV_HEADS * hd, d, std=0.15)
        tensors[base + "self_attn.v_proj.weight"] = normal(LLAMA_KV_HEADS * hd, d, std=0.15)
        tensors[base + "self_attn.o_proj.weight"] = normal(d, N_HEAD * hd, std=0.1)
        tensors[base + "post_attention_layernorm.weight"] = normal(d, mean=1.0, std=0.2)
        tensors[base + "mlp.gate_proj.weight"] = normal(f, d)
        tensors[base + "mlp.up_proj.weight"] = normal(f, d)
        tensors[base + "mlp.down_proj.weight"] = normal(d, f, std=0.05)
    tensors["model.norm.weight"] = normal(d, mean=1.0, std=0.2)
    tensors["lm_head.weight"] = normal(vocab_size, d)
    return tensors


def llama_config(vocab_size: int) -> dict:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": D_MODEL,
            "num_attention_heads": N_HEAD, "num_key_value_heads": LLAMA_KV_HEADS, "head_dim": LLAMA_HEAD_DIM,
            "intermediate_size": LLAMA_D_FF, "num_hidden_layers": N_LAYER, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "max_position_embeddings": N_POSITIONS, "vocab_size": vocab_size,
            "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
            "bos_token_id": 0, "eos_token_id": 0}


GEMMA2_HEAD_DIM, GEMMA2_D_FF, SMALL_LAYERS = 16, 128, 2


def gemma2_tensors(vocab_size: int) -> dict[str, torch.Tensor]:
    """Gemma2ForCausalLM's keys: four norms per layer, gains stored as w (the norm scales by 1 + w)."""
    normal = _normal(torch.Generator().manual_seed(SEED + 3))
    d, f, hd = D_MODEL, GEMMA2_D_FF, GEMMA2_HEAD_DIM
    tensors = {"model.embed_tokens.weight": normal(vocab_size, d, std=0.1)}
    for k in range(SMALL_LAYERS):
        base = f"model.layers.{k}."
        for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            tensors[base + norm + ".weight"] = normal(d, std=0.2)
        tensors[base + "self_attn.q_proj.weight"] = normal(N_HEAD * hd, d, std=0.15)
        tensors[base + "self_attn.k_proj.weight"] = normal(LLAMA_KV_HEADS * hd, d, std=0.15)
        tensors[base + "self_attn.v_proj.weight"] = normal(LLAMA_KV_HEADS * hd, d, std=0.15)
        tensors[base + "self_attn.o_proj.weight"] = normal(d, N_HEAD * hd, std=0.1)
        tensors[base + "mlp.gate_proj.weight"] = normal(f, d)
        tensors[base + "mlp.up_proj.weight"] = normal(f, d)
        tensors[base + "mlp.down_proj.weight"] = normal(d, f, std=0.05)
    tensors["model.norm.weight"] = normal(d, std=0.2)
    return tensors


def gemma2_config(vocab_size: int) -> dict:
    return {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "hidden_size": D_MODEL,
            "num_attention_heads": N_HEAD, "num_key_value_heads": LLAMA_KV_HEADS, "head_dim": GEMMA2_HEAD_DIM,
            "intermediate_size": GEMMA2_D_FF, "num_hidden_layers": SMALL_LAYERS, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "max_position_embeddings": N_POSITIONS, "vocab_size": vocab_size,
            "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": GEMMA2_HEAD_DIM,
            "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "sliding_window": 4,
            "layer_types": ["sliding_attention", "full_attention"], "tie_word_embeddings": True,
            "attention_bias": False, "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}


def neox_tensors(vocab_size: int) -> dict[str, torch.Tensor]:
    """GPTNeoXForCausalLM's keys: fused query_key_value interleaved per head, LayerNorms with bias."""
    normal = _normal(torch.Generator().manual_seed(SEED + 4))
    d, f = D_MODEL, 4 * D_MODEL
    tensors = {"gpt_neox.embed_in.weight": normal(vocab_size, d, std=0.5)}
    for k in range(SMALL_LAYERS):
        base = f"gpt_neox.layers.{k}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[base + norm + ".weight"] = normal(d, mean=1.0, std=0.2)
            tensors[base + norm + ".bias"] = normal(d)
        tensors[base + "attention.query_key_value.weight"] = normal(3 * d, d, std=0.15)
        tensors[base + "attention.query_key_value.bias"] = normal(3 * d)
        tensors[base + "attention.dense.weight"], tensors[base + "attention.dense.bias"] = normal(d, d), normal(d)
        tensors[base + "mlp.dense_h_to_4h.weight"], tensors[base + "mlp.dense_h_to_4h.bias"] = normal(f, d), normal(f)
        tensors[base + "mlp.dense_4h_to_h.weight"] = normal(d, f, std=0.05)
        tensors[base + "mlp.dense_4h_to_h.bias"] = normal(d)
    tensors["gpt_neox.final_layer_norm.weight"] = normal(d, mean=1.0, std=0.2)
    tensors["gpt_neox.final_layer_norm.bias"] = normal(d)
    tensors["embed_out.weight"] = normal(vocab_size, d)
    return tensors


def neox_config(vocab_size: int) -> dict:
    """Pythia's own config keys: rotary_pct and rotary_emb_base, as its config.json files have them."""
    return {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "hidden_size": D_MODEL,
            "num_attention_heads": N_HEAD, "intermediate_size": 4 * D_MODEL, "num_hidden_layers": SMALL_LAYERS,
            "hidden_act": "gelu", "layer_norm_eps": 1e-5, "rotary_pct": 0.25, "rotary_emb_base": 10000,
            "use_parallel_residual": True, "max_position_embeddings": N_POSITIONS, "vocab_size": vocab_size,
            "tie_word_embeddings": False, "attention_bias": True, "bos_token_id": 0, "eos_token_id": 0}


def make_checkpoint(directory: Path, tensors_for, config_for) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    vocab_size = write_tokenizer(directory / "tokenizer.json")
    save_file(tensors_for(vocab_size), str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config_for(vocab_size), indent=2, sort_keys=True) + "\n")


SAMPLES = {"gpt2-tiny": (gpt2_tensors, gpt2_config), "bert-tiny": (bert_tensors, bert_config),
           "llama-tiny": (llama_tensors, llama_config), "gemma2-tiny": (gemma2_tensors, gemma2_config),
           "neox-tiny": (neox_tensors, neox_config)}


def make_samples(output: Path) -> None:
    for name, (tensors_for, config_for) in SAMPLES.items():
        make_checkpoint(output / name, tensors_for, config_for)


def make_traces(checkpoint_dir: Path, directory: Path) -> None:
    """Two trace files of gpt2-tiny's layer 1 on 猫 吃 鱼, for the `blocktrace diff` example in docs/check.md:
    the block as it is, and the same block with LayerNorm eps 1e-3 (a "slightly different implementation")."""
    from blocktrace.sources.checkpoint import Checkpoint
    from blocktrace.sources.families import checkpoint_config, model_info
    from blocktrace.sources.loader import embed_token_ids, hidden_state_before, load_block
    from blocktrace.sources.tracefile import save_trace
    from blocktrace.tracing.tracer import trace

    directory.mkdir(parents=True, exist_ok=True)
    checkpoint = Checkpoint(checkpoint_dir)
    info = model_info(checkpoint)
    config = checkpoint_config(checkpoint, info, {})
    x = hidden_state_before(checkpoint, info, config, embed_token_ids(checkpoint, info, [1, 2, 3]), 1)
    for name, variant in (("layer1", config), ("layer1-eps1e-3", config.replace(eps=1e-3))):
        traced = trace(load_block(checkpoint, info, 1, variant), x, keep_tensors=True)
        save_trace(traced, directory / f"{name}.safetensors", tokens=["猫", "吃", "鱼"], force=True)


def main(output: Path) -> None:
    make_samples(output)
    make_traces(output / "gpt2-tiny", output / "traces")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
