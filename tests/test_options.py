"""blocktrace/cli/options.py: the words the options print — help that says what each option does, the families
--weights reads, bare `blocktrace` as --help — and the sentences no file name of the seeds reaches."""
from __future__ import annotations

from helpers import ROOT


def test_deepnorm_explains_deepnorm_and_post_ln_norm2_is_true_to_learned_gains(invoke):
    deep = invoke("run", "--deepnorm", "--explain").stdout
    assert "α·x" in deep and "only attention sees x_norm1" not in deep
    post = invoke("run", "--post-ln", "--explain").stdout
    assert "always has unit scale" not in post and "before the learned gain" in post


def test_no_seed_file_names_reach_the_user(invoke, monkeypatch):
    monkeypatch.chdir(ROOT)
    text = invoke("check", "--module", "examples.tutorial_block:forgot_residual").stdout
    assert "residual_not_added" in text and "seed 0" not in text


def test_bare_blocktrace_prints_help_and_h_is_help(invoke):
    bare = invoke()
    assert bare.exit_code == 0 and bare.stdout.startswith("Usage: ") and "Commands:" in bare.stdout
    assert bare.stderr == ""
    for args in (["-h"], ["run", "-h"], ["check", "-h"]):
        result = invoke(*args)
        assert result.exit_code == 0 and "Usage:" in result.stdout


def test_help_texts_say_what_each_option_does(invoke):
    run_help = invoke("run", "--help").stdout
    assert "--norm [layernorm|rmsnorm]" in run_help and "RMSNorm" in run_help
    compare_help = " ".join(invoke("compare", "--help").stdout.split())
    assert "--force Let --plot / --html overwrite" in compare_help and "--save" not in compare_help
    check_help = invoke("check", "--help").stdout
    assert "With --check" not in check_help and "--fail-on" in check_help

def test_the_weights_help_names_every_family_and_every_kind_of_file(invoke):
    """--weights' help listed ten safetensors families while .pt files and MoE checkpoints worked; a family added
    without its name in the help fails here."""
    from blocktrace.sources.families import FAMILIES

    shown = {"gpt2": "GPT-2", "bert": "BERT", "gpt_neox": "GPT-NeoX", "llama": "Llama", "mistral": "Mistral",
             "qwen2": "Qwen2/3", "qwen3": "Qwen2/3", "qwen2_moe": "Qwen-MoE", "qwen3_moe": "Qwen-MoE",
             "mixtral": "Mixtral", "olmo2": "OLMo-2/3", "olmo3": "OLMo-2/3", "olmoe": "OLMoE", "gemma": "Gemma 1–3",
             "gemma2": "Gemma 1–3", "gemma3": "Gemma 1–3", "phi3": "Phi-3", "starcoder2": "StarCoder2",
             "granite": "Granite", "smollm3": "SmolLM3", "exaone4": "EXAONE-4", "cohere": "Cohere 1–2",
             "cohere2": "Cohere 1–2", "gpt_oss": "gpt-oss", "deepseek_v2": "DeepSeek-V2/V3",
             "deepseek_v3": "DeepSeek-V2/V3", "llama4_text": "Llama-4", "lfm2": "LFM2", "seed_oss": "Seed-OSS", "ernie4_5": "ERNIE-4.5", "glm4_moe": "GLM-4.5", "minimax_m2": "MiniMax-M2", "qwen3_next": "Qwen3-Next", "granitemoehybrid": "Granite-4", "ernie4_5_moe": "ERNIE-4.5", "hunyuan_v1_dense": "Hunyuan", "hunyuan_v1_moe": "Hunyuan", "apertus": "Apertus", "helium": "Helium", "arcee": "Arcee", "glm4": "GLM-4", "dots1": "dots.llm1", "olmo_hybrid": "OLMo-Hybrid", "exaone_moe": "EXAONE-MoE", "qwen3_5_text": "Qwen3.5", "qwen3_5_moe_text": "Qwen3.5", "ministral": "Ministral", "nanogpt": "nanoGPT"}
    assert set(shown) == set(FAMILIES)
    text = " ".join(invoke("run", "--help").stdout.split())
    for name in {*shown.values(), ".pt", "sharded index", "HuggingFace cache"}:
        assert name in text, name
