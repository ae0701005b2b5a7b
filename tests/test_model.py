"""pipeline/model.py, `check --weights`: every layer, the model's own loss and its gradients, each equal to what
HuggingFace computes for the same model, the same tokens and the same labels."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import DEEPSEEK, LLAMA4, make_bert, make_deepseek, make_gpt2, randomise_hf

IDS = [5, 17, 99, 3, 42, 7, 63, 11]
SHORT = [8, 9, 10, 12]


def hf_model(name: str):
    import transformers

    small = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=3, vocab_size=101,
                 max_position_embeddings=64, attn_implementation="eager")
    if name == "gpt2":
        return make_gpt2(head=True)
    if name == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**small, num_key_value_heads=2))
    elif name == "gemma3":  # one global layer between sliding ones, its RoPE scaled; a final softcap
        model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
            **small, num_key_value_heads=2, head_dim=8, sliding_window=4, sliding_window_pattern=2,
            final_logit_softcapping=5.0, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                       "original_max_position_embeddings": 4}))
    elif name == "olmo2":
        model = transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**small, num_key_value_heads=2))
    elif name == "mixtral":
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(
            **small, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2))
    elif name == "qwen2_moe":  # the shared expert, and a dense layer among the sparse ones
        model = transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
            **small, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
            shared_expert_intermediate_size=40, decoder_sparse_step=2))
    elif name == "qwen3_moe":  # top-k renormalised (norm_topk_prob)
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            **small, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
            norm_topk_prob=True))
    elif name == "olmoe":
        model = transformers.OlmoeForCausalLM(transformers.OlmoeConfig(
            **small, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, pad_token_id=0, eos_token_id=1))
    elif name == "llama3 rope":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**small, rope_parameters={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 4, "rope_theta": 500.0}))
    elif name == "gemma2":
        model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
            **small, num_key_value_heads=2, head_dim=8, sliding_window=4, final_logit_softcapping=5.0))
    elif name == "starcoder2":  # LayerNorm with shifts, biases everywhere, a window over every layer, tied head
        model = transformers.Starcoder2ForCausalLM(transformers.Starcoder2Config(
            **small, num_key_value_heads=2, sliding_window=4))
    elif name == "granite":  # the logits divided, each residual update multiplied
        model = transformers.GraniteForCausalLM(transformers.GraniteConfig(
            **small, num_key_value_heads=2, embedding_multiplier=6.0, attention_multiplier=0.2,
            residual_multiplier=0.3, logits_scaling=4.0))
    elif name == "smollm3":  # a NoPE layer with a window
        model = transformers.SmolLM3ForCausalLM(transformers.SmolLM3Config(
            **small, num_key_value_heads=2, no_rope_layers=[1, 0, 1], use_sliding_window=True, sliding_window=4,
            pad_token_id=0, bos_token_id=1, eos_token_id=1))
    elif name == "seed_oss":  # biases on q/k/v, o and the MLP; its own head_dim
        model = transformers.SeedOssForCausalLM(transformers.SeedOssConfig(
            **small, num_key_value_heads=2, head_dim=16, attention_out_bias=True, mlp_bias=True))
    elif name == "ernie4_5":  # interleaved RoPE, biases everywhere, tied
        model = transformers.Ernie4_5ForCausalLM(transformers.Ernie4_5Config(
            **small, num_key_value_heads=2, head_dim=16, use_bias=True))
    elif name == "glm4_moe":  # DeepSeek-V3's experts after a dense layer, grouped-query attention, QK-norm
        model = transformers.Glm4MoeForCausalLM(transformers.Glm4MoeConfig(
            **small, num_key_value_heads=2, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
            n_group=2, topk_group=1, routed_scaling_factor=1.5, attention_bias=True, use_qk_norm=True))
    elif name == "minimax_m2":  # a biased sigmoid router, QK-norm over all heads, partial RoPE
        model = transformers.MiniMaxM2ForCausalLM(transformers.MiniMaxM2Config(
            **{**small, "intermediate_size": 16}, num_key_value_heads=2, head_dim=16, num_local_experts=4,
            num_experts_per_tok=2, rotary_dim=4, bos_token_id=1, eos_token_id=1))
    elif name == "lfm2":  # short convolutions around an attention layer
        model = transformers.Lfm2ForCausalLM(transformers.Lfm2Config(
            **small, num_key_value_heads=2, block_multiple_of=16, layer_types=["conv", "full_attention", "conv"]))
    elif name == "qwen3_next":  # delta-rule layers (one dense) before a gated attention layer, experts
        model = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(
            **{**small, "num_hidden_layers": 4}, num_key_value_heads=2, head_dim=8, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24, mlp_only_layers=[1]))
    elif name == "granitemoehybrid":  # Mamba-2 around an attention layer, experts beside a shared MLP, multipliers
        model = transformers.GraniteMoeHybridForCausalLM(transformers.GraniteMoeHybridConfig(
            **{**small, "intermediate_size": 16}, num_key_value_heads=2, shared_intermediate_size=24,
            num_local_experts=4, num_experts_per_tok=2, mamba_n_heads=4, mamba_d_state=8, mamba_n_groups=2,
            mamba_chunk_size=4, layer_types=["mamba", "attention", "mamba"], position_embedding_type="rope",
            embedding_multiplier=6.0, attention_multiplier=0.2, residual_multiplier=0.3, logits_scaling=4.0))
    elif name == "ernie4_5_moe":  # a dense layer, then experts chosen by softmax + a bias, shared experts
        model = transformers.Ernie4_5_MoeForCausalLM(transformers.Ernie4_5_MoeConfig(
            **small, num_key_value_heads=2, head_dim=16, moe_intermediate_size=16, moe_k=2, moe_num_experts=4,
            moe_num_shared_experts=2, moe_layer_start_index=1))
    elif name == "qwen3_5_text":  # Qwen3-Next's hybrid without experts, its delta net's projections apart
        model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(
            **small, num_key_value_heads=2, head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=8, linear_value_head_dim=8,
            layer_types=["linear_attention", "full_attention", "linear_attention"]))
    elif name == "qwen3_5_moe_text":  # the same with Qwen3-Next's experts in every layer
        model = transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(
            **{key: value for key, value in small.items() if key != "intermediate_size"}, num_key_value_heads=2,
            head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
            linear_value_head_dim=8, layer_types=["linear_attention", "full_attention", "linear_attention"],
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24))
    elif name == "exaone_moe":  # EXAONE-4's attention over DeepSeek-V3's experts, a NoPE global layer
        model = transformers.ExaoneMoeForCausalLM(transformers.ExaoneMoeConfig(
            **small, num_key_value_heads=2, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
            num_shared_experts=1, first_k_dense_replace=1, sliding_window=4, sliding_window_pattern=3,
            routed_scaling_factor=1.5))
    elif name == "hunyuan_v1_moe":  # Hunyuan's attention, experts and one shared MLP in every layer
        model = transformers.HunYuanMoEV1ForCausalLM(transformers.HunYuanMoEV1Config(
            **small, num_key_value_heads=2, head_dim=8, num_experts=4, moe_topk=2))
    elif name == "olmo_hybrid":  # delta-rule layers among OLMo-3 attention layers, NoPE as released
        config = transformers.OlmoHybridConfig(
            **small, num_key_value_heads=2, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
            linear_value_head_dim=8, layer_types=["linear_attention", "full_attention", "linear_attention"],
            pad_token_id=0, eos_token_id=1)
        config.rope_parameters = None
        model = transformers.OlmoHybridForCausalLM(config)
    elif name == "dots1":  # Qwen3's attention over DeepSeek-V3's experts after a dense layer
        model = transformers.Dots1ForCausalLM(transformers.Dots1Config(
            **small, num_key_value_heads=2, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
            n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1, routed_scaling_factor=1.5,
            norm_topk_prob=True, attention_bias=True))
    elif name == "glm4":  # four norms per layer, fused gate_up_proj, interleaved partial RoPE
        model = transformers.Glm4ForCausalLM(transformers.Glm4Config(**small, num_key_value_heads=2, head_dim=8,
                                                                     pad_token_id=0, eos_token_id=1))
    elif name == "arcee":  # an ungated ReLU² MLP
        model = transformers.ArceeForCausalLM(transformers.ArceeConfig(
            **small, num_key_value_heads=2, attention_bias=True, mlp_bias=True))
    elif name == "helium":  # interleaved RoPE, float32 norm gains, q/k/v and MLP biases
        model = transformers.HeliumForCausalLM(transformers.HeliumConfig(
            **small, num_key_value_heads=2, head_dim=8, attention_bias=True, mlp_bias=True))
    elif name == "apertus":  # xIELU's learned scalars randomised below with every parameter
        model = transformers.ApertusForCausalLM(transformers.ApertusConfig(**small, num_key_value_heads=2))
    elif name == "hunyuan_v1_dense":  # QK-norm after RoPE, RoPE's base stretched by a fixed alpha
        model = transformers.HunYuanDenseV1ForCausalLM(transformers.HunYuanDenseV1Config(
            **small, num_key_value_heads=2, head_dim=8, attention_bias=True, rope_parameters={
                "rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}))
    elif name == "olmo3":  # sliding, full, sliding
        model = transformers.Olmo3ForCausalLM(transformers.Olmo3Config(
            **small, num_key_value_heads=2, sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"]))
    elif name == "exaone4":  # its global layer without RoPE
        model = transformers.Exaone4ForCausalLM(transformers.Exaone4Config(
            **small, num_key_value_heads=2, sliding_window=4, sliding_window_pattern=2, pad_token_id=0))
    elif name == "cohere":  # one norm for both parallel sublayers, the logits scaled
        model = transformers.CohereForCausalLM(transformers.CohereConfig(
            **small, num_key_value_heads=2, logit_scale=0.5, pad_token_id=0, bos_token_id=1, eos_token_id=1))
    elif name == "cohere2":  # sliding, full (no RoPE), sliding
        model = transformers.Cohere2ForCausalLM(transformers.Cohere2Config(
            **small, num_key_value_heads=2, sliding_window=4, sliding_window_pattern=2, pad_token_id=0,
            bos_token_id=1, eos_token_id=1))
    elif name == "gpt_oss":  # sinks, a biased router, clamped experts; sliding, full, sliding
        model = transformers.GptOssForCausalLM(transformers.GptOssConfig(
            **small, num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"], pad_token_id=0, eos_token_id=1))
    elif name in DEEPSEEK:  # latent attention; a dense layer, then grouped routers
        return make_deepseek(name, small, seed=7)
    elif name == "llama4_text":  # chunked RoPE layers, a NoPE layer with its temperature, experts scaling their input
        model = transformers.Llama4ForCausalLM(transformers.Llama4TextConfig(**{**small, **LLAMA4}, num_experts_per_tok=1))
    else:
        model = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**small))
    randomise_hf(model, seed=7)
    return model.eval()


def layers_of(model):
    for path in ("transformer.h", "model.layers", "gpt_neox.layers", "bert.encoder.layer"):
        try:
            return model.get_submodule(path)
        except AttributeError:
            continue
    raise AssertionError("no layers")


def hf_loss_and_layer_gradients(model, ids: list[list[int]], mask, labels) -> tuple[float, list[float]]:
    model.zero_grad()
    output = model(torch.tensor(ids), attention_mask=mask, labels=labels)
    output.loss.backward()
    norms = [math.sqrt(sum(p.grad.double().pow(2).sum().item() for p in layer.parameters() if p.grad is not None))
             for layer in layers_of(model)]
    model.zero_grad()
    return output.loss.item(), norms


def our_layer_gradients(report: dict) -> list[float]:
    return [math.sqrt(sum(entry["grad"] ** 2 for entry in layer["parameters"].values()))
            for layer in report["gradients"]["layers"]]


@pytest.mark.parametrize("name", ["gpt2", "llama", "gemma2", "gemma3", "olmo2", "mixtral", "qwen2_moe", "qwen3_moe",
                                  "olmoe", "llama3 rope", "gpt_neox", "starcoder2", "granite", "smollm3", "olmo3",
                                  "exaone4", "cohere", "cohere2", "gpt_oss", "deepseek_v3", "deepseek_v2",
                                  "llama4_text", "lfm2", "seed_oss", "ernie4_5", "glm4_moe",
                                  "minimax_m2", "qwen3_next", "granitemoehybrid", "ernie4_5_moe",
                                  "hunyuan_v1_dense", "apertus", "helium", "arcee", "glm4", "dots1",
                                  "qwen3_5_text", "qwen3_5_moe_text", "exaone_moe", "hunyuan_v1_moe",
                                  "olmo_hybrid"])
def test_loss_and_gradients_equal_huggingface(invoke, tmp_path, name):
    model = hf_model(name)
    model.save_pretrained(tmp_path)
    result = invoke("check", "--weights", str(tmp_path), "--token-ids", *map(str, IDS), "--grad", "--json")
    assert result.exit_code in (0, 1), result.output
    report = json.loads(result.stdout)
    labels = torch.tensor([IDS])
    loss, gradients = hf_loss_and_layer_gradients(model, [IDS], None, labels)
    assert report["loss"] == pytest.approx(loss, rel=1e-5)
    assert report["gradients"]["loss"] == pytest.approx(loss, rel=1e-5)
    assert our_layer_gradients(report) == pytest.approx(gradients, rel=1e-5)
    assert report["traced_layers"] == list(range(len(layers_of(model))))


@pytest.mark.parametrize("name", ["llama", "granite", "smollm3", "olmo3", "exaone4", "cohere", "cohere2", "gpt_oss",
                                  "deepseek_v3", "deepseek_v2", "llama4_text", "lfm2", "glm4_moe", "qwen3_next",
                                  "granitemoehybrid", "qwen3_5_text", "qwen3_5_moe_text", "olmo_hybrid"])
def test_a_padded_batch_predicts_real_tokens_only(invoke, tmp_path, name):
    model = hf_model(name)
    model.save_pretrained(tmp_path)
    result = invoke("check", "--weights", str(tmp_path), "--token-ids", *map(str, IDS), "/", *map(str, SHORT),
                    "--grad", "--json")
    report = json.loads(result.stdout)
    padded = [IDS, SHORT + [0] * (len(IDS) - len(SHORT))]
    mask = torch.tensor([[1] * len(IDS), [1] * len(SHORT) + [0] * (len(IDS) - len(SHORT))])
    labels = torch.tensor(padded).masked_fill(mask == 0, -100)
    loss, gradients = hf_loss_and_layer_gradients(model, padded, mask, labels)
    assert report["loss"] == pytest.approx(loss, rel=1e-5)
    assert our_layer_gradients(report) == pytest.approx(gradients, rel=1e-5)
    assert report["loss_detail"]["tokens"] == (len(IDS) - 1) + (len(SHORT) - 1)


def test_text_file_gives_the_same_batch_as_token_ids(invoke, tmp_path):
    from helpers import SAMPLES

    (tmp_path / "text.txt").write_text("猫 吃 鱼 .\n\n狗 喝 水\n", encoding="utf-8")
    by_file = json.loads(invoke("check", "--weights", str(SAMPLES / "gpt2-tiny"), "--text-file",
                                str(tmp_path / "text.txt"), "--json").stdout)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(SAMPLES / "gpt2-tiny" / "tokenizer.json"))
    first, second = (tokenizer.encode(line).ids for line in ("猫 吃 鱼 .", "狗 喝 水"))
    by_ids = json.loads(invoke("check", "--weights", str(SAMPLES / "gpt2-tiny"), "--token-ids", *map(str, first),
                               "/", *map(str, second), "--json").stdout)
    assert by_file["loss"] == pytest.approx(by_ids["loss"], rel=1e-6)
    assert by_file["input"]["sequences"] == 2 and by_file["input"]["tokens"] == 7


def bert_tokenizer(path, vocab_size: int):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(5, vocab_size)]]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([AddedToken(w, special=True) for w in words[:5]])
    tokenizer.save(str(path))


def test_bert_masked_lm_loss_equals_huggingface(invoke, tmp_path):
    from blocktrace.diagnose.loss import mask_for_mlm

    saved, _ = make_bert(head=True)
    saved.save_pretrained(tmp_path)
    bert_tokenizer(tmp_path / "tokenizer.json", saved.config.vocab_size)
    ids = [2, *IDS, 3]
    report = json.loads(invoke("check", "--weights", str(tmp_path), "--token-ids", *map(str, ids), "--json").stdout)
    masked, labels = mask_for_mlm(torch.tensor([ids]), None, 4, {0, 1, 2, 3, 4})
    assert int((labels >= 0).sum()) >= 1 and (masked[labels >= 0] == 4).all()
    with torch.no_grad():
        expected = saved(masked, labels=labels).loss.item()
    assert report["loss"] == pytest.approx(expected, rel=1e-5)
    assert report["loss_detail"]["kind"] == "masked"


def test_bert_check_reads_token_types_as_huggingface_does(invoke, tmp_path):
    """Once: check and track dropped --token-type-ids without a word (run honoured them)."""
    from blocktrace.diagnose.loss import mask_for_mlm

    saved, _ = make_bert(head=True)
    saved.save_pretrained(tmp_path)
    bert_tokenizer(tmp_path / "tokenizer.json", saved.config.vocab_size)
    ids, types = [2, *IDS, 3], [0] * 4 + [1] * (len(IDS) - 2)
    report = json.loads(invoke("check", "--weights", str(tmp_path), "--token-ids", *map(str, ids),
                               "--token-type-ids", *map(str, types), "--json").stdout)
    masked, labels = mask_for_mlm(torch.tensor([ids]), None, 4, {0, 1, 2, 3, 4})
    with torch.no_grad():
        expected = saved(masked, token_type_ids=torch.tensor([types]), labels=labels).loss.item()
        without = saved(masked, labels=labels).loss.item()
    assert abs(expected - without) > 1e-3  # the types matter to this model
    assert report["loss"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("command", ["check", "track"])
def test_token_types_of_a_model_without_them_are_refused(invoke, tmp_path, command):
    hf_model("gpt2").save_pretrained(tmp_path)
    sources = [str(tmp_path), "--steps", "0"] if command == "track" else ["--weights", str(tmp_path)]
    result = invoke(command, *sources, "--token-ids", "1", "2", "--token-type-ids", "0", "0")
    assert result.exit_code == 2 and "gpt2 checkpoints have no token types" in result.stderr


def test_checkpoints_without_a_head_say_why_there_is_no_loss(invoke, tmp_path):
    saved, _ = make_bert(head=False)
    saved.save_pretrained(tmp_path)
    report = json.loads(invoke("check", "--weights", str(tmp_path), "--token-ids", "1", "2", "3", "--json").stdout)
    assert report["loss"] is None and "no masked-LM head" in report["loss_note"]
    assert set(report) >= {"loss", "loss_note", "flags", "diagnosis"}


def test_layer_and_layers_narrow_the_check(invoke, tmp_path):
    model = hf_model("gpt2")
    model.save_pretrained(tmp_path)
    full = json.loads(invoke("check", "--weights", str(tmp_path), "--token-ids", *map(str, IDS), "--json").stdout)
    one = json.loads(invoke("check", "--weights", str(tmp_path), "--layer", "1", "--token-ids", *map(str, IDS),
                            "--json").stdout)
    two = json.loads(invoke("check", "--weights", str(tmp_path), "--layer", "1", "--layers", "2", "--token-ids",
                            *map(str, IDS), "--json").stdout)
    assert full["traced_layers"] == [0, 1, 2] and one["traced_layers"] == [1] and two["traced_layers"] == [1, 2]
    assert full["loss"] == one["loss"] == two["loss"]  # the loss is always the whole model's
    assert one["layers"][0]["steps"] == full["layers"][1]["steps"]


def test_attn_chunk_reaches_every_layer_of_a_whole_model_check(monkeypatch):
    """`check --weights --attn-chunk N` was accepted and ignored: the layers chunked as the budget chose."""
    from click.testing import CliRunner
    from helpers import SAMPLES

    from blocktrace.cli import cli
    from blocktrace.model.layers import MultiHeadAttention

    chunks = []
    original = MultiHeadAttention.chunk_rows
    monkeypatch.setattr(MultiHeadAttention, "chunk_rows", lambda self, q: chunks.append(original(self, q)) or chunks[-1])
    args = ["check", "--weights", str(SAMPLES / "gpt2-tiny"), "--token-ids", "1 2 3 4 5", "--json", "--grad"]
    whole = json.loads(CliRunner().invoke(cli, args).output)
    assert set(chunks) == {5}
    chunks.clear()
    chunked = json.loads(CliRunner().invoke(cli, [*args, "--attn-chunk", "2"]).output)
    assert chunks and set(chunks) == {2}
    assert chunked["loss"] == pytest.approx(whole["loss"], rel=1e-6)
    assert [layer["attention"]["max_logit"] for layer in chunked["layers"]] == pytest.approx(
        [layer["attention"]["max_logit"] for layer in whole["layers"]], rel=1e-6)


def test_a_whole_model_check_that_cannot_fit_is_refused_before_it_starts(tmp_path, monkeypatch):
    """The memory guard of `run` covers `check --weights` too: a long --text-file is refused with the estimate."""
    from click.testing import CliRunner
    from helpers import SAMPLES

    import blocktrace.sizing
    from blocktrace.cli import cli

    monkeypatch.setattr(blocktrace.sizing, "available_bytes", lambda device: 2**20)
    ids = " ".join(["1 2 3 4"] * 30)
    result = CliRunner().invoke(cli, ["check", "--weights", str(SAMPLES / "gpt2-tiny"), "--token-ids", ids])
    assert result.exit_code == 2 and "this run needs about" in result.output and "1.0 MiB is available" in result.output


def _gpt2_checkpoint(directory, change=None):
    """A 4-layer GPT-2 at HF's own initialisation, one tensor changed as a bug would change it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_head=2, n_layer=4, n_positions=32, vocab_size=61))
    if change is not None:
        with torch.no_grad():
            change(model)
    model.save_pretrained(directory)
    return directory


@pytest.mark.parametrize("change, named", [
    (lambda m: m.transformer.h[2].mlp.c_fc.weight.fill_(float("nan")), "weights_non_finite"),
    (lambda m: m.transformer.h[1].mlp.c_proj.weight.mul_(50), "weight_outlier"),
])
def test_a_checkpoint_tensor_broken_outside_training_is_weights_not_the_learning_rate(invoke, tmp_path, change, named):
    """A tensor full of NaN, or one layer's FFN ×50: whatever it causes downstream (NaN steps, a loss above uniform),
    the cause is the weights in the file."""
    directory = _gpt2_checkpoint(tmp_path, change)
    result = invoke("check", "--weights", str(directory), "--token-ids", *map(str, range(20)), "--json")
    report = json.loads(result.stdout)
    assert result.exit_code == 1
    assert named in {f["name"] for f in report["flags"]}
    assert report["diagnosis"][0]["cause"] == "weights"


def test_the_same_checkpoint_untouched_raises_neither(invoke, tmp_path):
    directory = _gpt2_checkpoint(tmp_path)
    report = json.loads(invoke("check", "--weights", str(directory), "--token-ids", *map(str, range(20)),
                               "--json").stdout)
    assert not {"weights_non_finite", "weight_outlier"} & {f["name"] for f in report["flags"]}


def test_the_findings_count_says_how_many_kinds_the_table_rows_are(invoke):
    """A table row per kind of finding, its `times` column counting them: the line above says both counts."""
    from helpers import SAMPLES

    run = SAMPLES / "training" / "gpt2-lr-high" / "step_0050"
    args = ["check", "--weights", str(run), "--text-file", str(SAMPLES / "training" / "eval.txt")]
    flags = [f for f in json.loads(invoke(*args, "--json").stdout)["flags"] if f["level"] != "info"]
    kinds = {f["name"] for f in flags}
    assert len(kinds) < len(flags)  # the case the line was wrong on
    text = invoke(*args).stdout
    assert f"{len(flags)} findings of {len(kinds)} kinds:" in text
    table = text.split("level    finding")[1].split("\n\n")[0].strip().splitlines()[2:]
    assert len(table) == len(kinds) and sum(int(row.split()[5]) for row in table) == len(flags)


def test_check_grad_prints_the_gradients_it_judged(invoke):
    """`check --grad` shows each layer's gradient norms, the numbers its --json holds, not only findings."""
    from helpers import SAMPLES

    args = ["check", "--weights", str(SAMPLES / "gpt2-tiny"), "--token-ids", "1", "2", "3", "--grad"]
    layers = json.loads(invoke(*args, "--json").stdout)["gradients"]["layers"]
    text = invoke(*args).stdout
    assert "the model's own next-token loss" in text
    for layer in layers:
        row = next(line.split() for line in text.split("‖∂L/∂W‖_F")[1].splitlines()
                   if line.split()[:1] == [str(layer["layer"])])
        assert [float(v) for v in row[1:]] == pytest.approx(list(layer["weight_grad_norms"].values()), rel=1e-3)


def test_each_layers_settings_are_the_header_with_its_own_differences_as_hf_configures_it(invoke, tmp_path):
    """A layer whose block differs from the model's config (a dense layer among experts, a global layer among
    windowed ones) says so in the document (config_differences) and under the table's header; read as the header
    plus its differences, every layer has the window and FFN that HF's config gives it."""
    windowed, experts = hf_model("olmo3"), hf_model("deepseek_v3")
    for name, model in (("olmo3", windowed), ("deepseek_v3", experts)):
        model.save_pretrained(tmp_path / name)
    for name, model in (("olmo3", windowed), ("deepseek_v3", experts)):
        report = json.loads(invoke("check", "--weights", str(tmp_path / name), "--token-ids", *map(str, IDS),
                                   "--json").stdout)
        settings = [{**report["config"], **layer["config_differences"]} for layer in report["layers"]]
        hf = model.config
        if name == "olmo3":
            assert [s["sliding_window"] for s in settings] == \
                [hf.sliding_window if kind == "sliding_attention" else None for kind in hf.layer_types]
        else:
            dense = [layer < hf.first_k_dense_replace for layer in range(hf.num_hidden_layers)]
            assert [(s["d_ff"], s["experts"] and s["experts"]["n_experts"]) for s in settings] == \
                [(hf.intermediate_size, None) if d else (hf.moe_intermediate_size, hf.n_routed_experts) for d in dense]
        assert any(layer["config_differences"] for layer in report["layers"])
    text = invoke("check", "--weights", str(tmp_path / "deepseek_v3"), "--token-ids", *map(str, IDS)).stdout
    line = text.splitlines()[text.splitlines().index("where a layer's block differs from that:") + 1]
    assert line == f"  layer 0: d_ff={experts.config.intermediate_size} experts=None"  # no router said of it
