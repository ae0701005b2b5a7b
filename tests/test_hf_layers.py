"""HF layers and users' blocks through `--module`: called as their model calls them, measured for
what they really do (causality, norm kind), never crashing where weights are not visible."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from blocktrace.tracing.tracer import trace

BLOCKS = textwrap.dedent('''
    import torch
    from torch import nn
    from torch.nn import functional as F
    import transformers
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block
    from transformers.models.bert.modeling_bert import BertLayer
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    def gpt2():
        torch.manual_seed(0)
        return GPT2Block(transformers.GPT2Config(n_embd=16, n_head=4), layer_idx=0)

    def bert():
        torch.manual_seed(0)
        return BertLayer(transformers.BertConfig(hidden_size=16, num_attention_heads=4, intermediate_size=32))

    def llama():
        torch.manual_seed(0)
        config = transformers.LlamaConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2,
                                          intermediate_size=32)
        return LlamaDecoderLayer(config, layer_idx=0)

    def qwen3():  # its q_norm (head_dim 8 wide) comes before its input norm (16 wide) among its modules
        torch.manual_seed(0)
        from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer
        config = transformers.Qwen3Config(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                          intermediate_size=32)
        return Qwen3DecoderLayer(config, layer_idx=0)

    def olmo2():
        torch.manual_seed(0)
        from transformers.models.olmo2.modeling_olmo2 import Olmo2DecoderLayer
        config = transformers.Olmo2Config(hidden_size=16, num_attention_heads=4, intermediate_size=32)
        return Olmo2DecoderLayer(config, layer_idx=0)

    def mixtral():
        torch.manual_seed(0)
        from transformers.models.mixtral.modeling_mixtral import MixtralDecoderLayer
        config = transformers.MixtralConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2,
                                            intermediate_size=32, num_local_experts=4, num_experts_per_tok=2)
        return MixtralDecoderLayer(config, layer_idx=0)

    class CausalSelfAttention(nn.Module):  # nanoGPT's
        def __init__(self, causal=True):
            super().__init__()
            self.c_attn, self.c_proj, self.causal = nn.Linear(16, 48), nn.Linear(16, 16), causal

        def forward(self, x):
            b, t, c = x.size()
            q, k, v = (z.view(b, t, 4, c // 4).transpose(1, 2) for z in self.c_attn(x).split(c, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    class Block(nn.Module):  # nanoGPT's Block
        def __init__(self, causal=True):
            super().__init__()
            self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(16), CausalSelfAttention(causal), nn.LayerNorm(16)
            self.mlp = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    def nano():
        torch.manual_seed(0)
        return Block()

    def nano_no_mask():
        torch.manual_seed(0)
        return Block(causal=False)

    class RMSNorm(nn.Module):  # seed 001's, written by hand
        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    class RMSBlock(Block):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = RMSNorm(16), RMSNorm(16)

    def custom_rmsnorm():
        torch.manual_seed(0)
        return RMSBlock()
''')


@pytest.fixture
def blocks(tmp_path, monkeypatch):
    (tmp_path / "hfblocks.py").write_text(BLOCKS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("factory", ["gpt2", "bert", "llama", "nano", "custom_rmsnorm"])
@pytest.mark.parametrize("extra", [[], ["--batch", "2"], ["--dtype", "float64"]])
def test_hf_and_user_blocks_run_and_check_cleanly(invoke, blocks, factory, extra):
    run = invoke("run", "--module", f"hfblocks:{factory}", "--tokens", "猫", "吃", "鱼", "!", *extra)
    assert run.exit_code == 0, run.output
    assert "Traceback" not in run.output and "block_shape_preserved=True" in run.stdout
    report = json.loads(invoke("run", "--module", f"hfblocks:{factory}", "--seq-len", "5", "--json", *extra).stdout)
    assert {s["dtype"] for s in report["steps"]} == {"float64" if "float64" in extra else "float32"}
    check = invoke("check", "--module", f"hfblocks:{factory}", "--seq-len", "6", *extra)
    assert check.exit_code == 0, check.output


@pytest.mark.parametrize("factory", ["qwen3", "olmo2", "mixtral"])
def test_the_newer_hf_layers_run_through_module_at_their_own_width(invoke, blocks, factory):
    """Once: Qwen3's width was read off q_norm (its head size), so --module never worked with it."""
    report = json.loads(invoke("run", "--module", f"hfblocks:{factory}", "--seq-len", "5", "--json").stdout)
    assert report["input"]["shape"][-2:] == [5, 16] and report["block_shape_preserved"]
    assert [s["name"] for s in report["steps"]][-1] == "residual2"
    if factory == "mixtral":
        assert report["routing"]["experts"] == 4 and report["routing"]["tokens"] == 5


def test_module_takes_a_python_file_by_its_path(invoke, blocks, tmp_path, monkeypatch):
    """Once refused: --module path/to/file.py:factory, with the file's sibling imports found beside it."""
    (blocks / "helper_width.py").write_text("WIDTH = 16\n")
    (blocks / "my_block.py").write_text(BLOCKS + "\nfrom helper_width import WIDTH\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for path in (str(blocks / "my_block.py"), "../my_block.py"):
        result = invoke("run", "--module", f"{path}:nano", "--seq-len", "4", "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["input"]["shape"][-2:] == [4, 16]
    missing = invoke("run", "--module", "nowhere.py:nano")
    assert missing.exit_code == 2 and "nowhere.py is not a file" in missing.stderr
    import sys
    assert not [name for name in sys.modules if name.startswith("blocktrace_user_block_")]


def test_a_gpt2_block_gets_its_causal_mask(invoke, blocks):
    report = json.loads(invoke("run", "--module", "hfblocks:gpt2", "--seq-len", "6", "--json").stdout)
    assert report["attention"]["future_weight_sum"] == 0.0
    assert any("called as its model calls it: causal mask" in note for note in report["notes"])


def test_where_weights_are_not_visible_the_table_and_plot_say_so(invoke, blocks):
    text = invoke("run", "--module", "hfblocks:nano", "--tokens", "a", "b", "c").stdout
    assert "attention weights are not visible" in text
    plot = blocks / "p.png"
    result = invoke("run", "--module", "hfblocks:nano", "--plot", str(plot))
    assert result.exit_code == 0 and plot.read_bytes()[:4] == b"\x89PNG"


def test_a_missing_causal_mask_in_a_users_block_is_an_error(invoke, blocks):
    result = invoke("check", "--module", "hfblocks:nano_no_mask", "--seq-len", "6")
    assert result.exit_code == 1 and "ERROR    causal_leak" in result.stdout and "most likely: mask" in result.stdout
    assert "perturbing the last token moved earlier outputs" in result.stdout


def test_a_hand_written_rmsnorm_is_measured_as_rmsnorm(blocks):
    import importlib
    import sys

    sys.path.insert(0, str(blocks))
    try:
        block = importlib.import_module("hfblocks").custom_rmsnorm().eval()
    finally:
        sys.path.remove(str(blocks))
        sys.modules.pop("hfblocks", None)
    traced = trace(block, torch.randn(1, 6, 16), checks=True)
    for step in ("norm1", "norm2"):
        assert traced.step(step).probe.norm.kind.value == "rmsnorm"
    layernormed = trace(torch.nn.Identity(), torch.randn(6, 16), checks=True,
                        steps={"norm1": "", "attn": "", "norm2": "", "ffn": ""})
    assert layernormed.step("norm1").probe.norm.kind.value == "none"


def test_a_failure_inside_blocktrace_is_not_blamed_on_the_users_forward(invoke, blocks, monkeypatch):
    import blocktrace.tracing.recorder as recorder

    calls, original = [], recorder.tensor_moments

    def broken_inside_the_forward(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:  # the first call measures the input, before the forward; the rest run in hooks
            raise ZeroDivisionError("a bug in blocktrace")
        return original(*args, **kwargs)

    monkeypatch.setattr(recorder, "tensor_moments", broken_inside_the_forward)
    with pytest.raises(ZeroDivisionError, match="a bug in blocktrace"):
        invoke("run", "--module", "hfblocks:nano")


def _one_watched_step(path, model_class: str, config_class: str, **config) -> dict:
    """An HF model from a config, trained one step in training mode under a Watch: its record."""
    import transformers

    from blocktrace import Watch
    from blocktrace.training.timeline import read_timeline

    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(vocab_size=256, **config)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Watch(model, path, every=1, optimizer=optimizer, overwrite=True) as watch:
        ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        watch.step(loss)
        optimizer.step()
    return read_timeline(path)[0]


LLAMA_SIZES = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}
SERIOUS = ("error", "warning")


@pytest.mark.parametrize("family, dropout", [("GPTNeoX", {"hidden_dropout": 0.1}), ("Phi3", {"resid_pdrop": 0.1})])
def test_a_layer_whose_dropout_sits_outside_its_sublayers_adds_what_it_traced(tmp_path, family, dropout):
    """GPT-NeoX and Phi-3 drop out each sublayer's output in the layer itself, between the attention (or MLP) module
    and the residual add: the steps are the dropouts' outputs, what the add takes, so in training the residual sums
    hold (each residual was called 'not added', ‖output − (stream + update)‖/‖output‖ ≈ 0.2, before)."""
    record = _one_watched_step(tmp_path / "run.jsonl", f"{family}ForCausalLM", f"{family}Config", pad_token_id=0,
                               **LLAMA_SIZES, **dropout)
    assert record["layers"][0]["max_logit"] is not None  # the attention weights still read off its own module
    assert not [f for f in record["flags"] if f["level"] in SERIOUS]


SIX = ["norm1", "attn", "residual1", "norm2", "ffn", "residual2"]
PARALLEL_FIVE = ["norm1", "attn", "residual1", "ffn", "residual2"]  # one norm read by both sublayers
POST_SIX = ["attn", "residual1", "norm1", "ffn", "residual2", "norm2"]
GPTJ_SIZES = {"n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8, "resid_pdrop": 0.1, "embd_pdrop": 0.0,
              "attn_pdrop": 0.0}
TRACED_ONLY_MODELS = {  # model class, config class, config, the steps of a layer
    "olmo": ("OlmoForCausalLM", "OlmoConfig", LLAMA_SIZES, SIX),
    "gptj": ("GPTJForCausalLM", "GPTJConfig", GPTJ_SIZES, PARALLEL_FIVE),
    "codegen": ("CodeGenForCausalLM", "CodeGenConfig", GPTJ_SIZES, PARALLEL_FIVE),
    "stablelm": ("StableLmForCausalLM", "StableLmConfig",
                 {**LLAMA_SIZES, "hidden_dropout": 0.1, "num_key_value_heads": 4}, SIX),
    "stablelm-parallel": ("StableLmForCausalLM", "StableLmConfig",
                          {**LLAMA_SIZES, "hidden_dropout": 0.1, "num_key_value_heads": 4,
                           "use_parallel_residual": True}, PARALLEL_FIVE),
    "persimmon": ("PersimmonForCausalLM", "PersimmonConfig", {**LLAMA_SIZES, "hidden_dropout": 0.1}, SIX),
    "nemotron": ("NemotronForCausalLM", "NemotronConfig", {**LLAMA_SIZES, "num_key_value_heads": 2}, SIX),
    "glm": ("GlmForCausalLM", "GlmConfig", {**LLAMA_SIZES, "num_key_value_heads": 2, "pad_token_id": 0}, SIX),
    # GPT-1: Post-LN, ln_2(n + mlp(n)) with n = ln_1(x + attn(x)), under submodule names nanoGPT's Pre-LN Block shares
    "openai-gpt": ("OpenAIGPTLMHeadModel", "OpenAIGPTConfig",
                   {"n_embd": 64, "n_layer": 2, "n_head": 4, "resid_pdrop": 0.1, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
                   POST_SIX),
}


@pytest.mark.parametrize("name", list(TRACED_ONLY_MODELS))
def test_hf_layers_traced_only_are_watched_step_by_step(tmp_path, name):
    """OLMo-1, GPT-J, CodeGen, StableLM (sequential and parallel), Persimmon, Nemotron and GLM (refused as blind12 was
    written), and GPT-1 (whose Post-LN blocks were taken for nanoGPT's Pre-LN ones by their submodule names:
    residual_not_added at every layer of blind15's healthy runs), whose checkpoints blocktrace
    does not read, are traced as they are under the Watch (refused before: 'cannot find the Transformer blocks'):
    every step of their wiring in every layer, the residual sums holding in training with their dropouts on, nothing
    raised."""
    model_class, config_class, config, steps = TRACED_ONLY_MODELS[name]
    record = _one_watched_step(tmp_path / "run.jsonl", model_class, config_class, **config)
    assert [list(layer["steps"]) for layer in record["layers"]] == [steps] * 2
    assert record["layers"][0]["max_logit"] is not None  # the attention's weights read
    assert not [f for f in record["flags"] if f["level"] in SERIOUS]
