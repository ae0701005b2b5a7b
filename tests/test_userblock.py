"""sources/userblock.py and tracing/steps.py: your own block: HF GPT2Block, BertLayer, LlamaDecoderLayer and a nanoGPT
block, traced without naming the steps; the recovered residual sums equal what the modules compute."""

import json
import sys

import pytest
import torch
from helpers import make_gpt2, randomise_, strict_json
from torch import nn
from torch.nn import functional as F

from blocktrace.sources.tracefile import save_trace
from blocktrace.tracing.tracer import trace

T, D = 6, 32
X = torch.randn(2, T, D, generator=torch.Generator().manual_seed(0))
CAUSAL = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)[None, None]
SIX = ["norm1", "attn", "residual1", "norm2", "ffn", "residual2"]


def _first(value):
    return value[0] if isinstance(value, tuple) else value


def _randomise(module, seed=1):
    randomise_(module, seed)
    return module.eval()


def gpt2_block():
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    block = _randomise(GPT2Block(GPT2Config(n_embd=D, n_head=4, attn_implementation="eager"), layer_idx=0))
    with torch.no_grad():
        r1 = X + _first(block.attn(block.ln_1(X), attention_mask=CAUSAL))
        r2 = r1 + block.mlp(block.ln_2(r1))
    return block, {"attention_mask": CAUSAL}, {"residual1": r1, "residual2": r2}


def bert_layer():
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    layer = BertLayer(BertConfig(hidden_size=D, num_attention_heads=4, intermediate_size=64,
                                 attn_implementation="eager")).eval()
    _randomise(layer)
    with torch.no_grad():
        attended = _first(layer.attention.self(X))
        r1 = layer.attention.output.dense(attended) + X
        n1 = layer.attention.output.LayerNorm(r1)
        r2 = layer.output.dense(layer.intermediate(n1)) + n1
    return layer, {}, {"residual1": r1, "residual2": r2, "norm2": layer.output.LayerNorm(r2)}


def llama_layer():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=D, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                         attn_implementation="eager")
    layer = LlamaDecoderLayer(config, layer_idx=0).eval()
    _randomise(layer)
    position = LlamaRotaryEmbedding(config)(X, torch.arange(T)[None])
    kwargs = {"attention_mask": CAUSAL, "position_embeddings": position}
    with torch.no_grad():
        r1 = X + _first(layer.self_attn(layer.input_layernorm(X), **kwargs))
        r2 = r1 + layer.mlp(layer.post_attention_layernorm(r1))
    return layer, kwargs, {"residual1": r1, "residual2": r2}


class CausalSelfAttention(nn.Module):  # nanoGPT's, with its fused attention
    def __init__(self):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, 4, c // 4).transpose(1, 2) for z in self.c_attn(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class NanoBlock(nn.Module):  # nanoGPT's Block: the residual sums are inline
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(D), CausalSelfAttention(), nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def nano_block():
    block = _randomise(NanoBlock())
    with torch.no_grad():
        r1 = X + block.attn(block.ln_1(X))
        r2 = r1 + block.mlp(block.ln_2(r1))
    return block, {}, {"residual1": r1, "residual2": r2}


def book_block():
    """"Build a Large Language Model (From Scratch)"'s TransformerBlock (tests/book_gpt.py): attention by hand."""
    from book_gpt import SMALL, TransformerBlock

    block = _randomise(TransformerBlock({**SMALL, "emb_dim": D, "n_heads": 4}))
    with torch.no_grad():
        r1 = X + block.att(block.norm1(X))
        r2 = r1 + block.ff(block.norm2(r1))
    return block, {}, {"residual1": r1, "residual2": r2}


@pytest.mark.parametrize("make, order, weights", [
    (gpt2_block, SIX, True),
    (bert_layer, ["attn", "residual1", "norm1", "ffn", "residual2", "norm2"], True),
    (llama_layer, SIX, True),
    (nano_block, SIX, False),
    (book_block, SIX, True),
])
@pytest.mark.parametrize("bare", [False, True], ids=["model's arguments given", "bare: blocktrace supplies them"])
def test_known_blocks_trace_without_naming_steps(make, order, weights, bare):
    block, kwargs, expected = make()
    traced = trace(block, X, keep_tensors=True, checks=True, forward_kwargs=None if bare else kwargs)
    assert [s.name for s in traced.steps] == order and traced.missing == []
    tensors = {s.name: s.tensor for s in traced.steps}
    for name, value in expected.items():
        assert (tensors[name] - value).abs().max().item() <= 1e-6, name
    with torch.no_grad():
        assert torch.allclose(traced.output, _first(block(X, **kwargs)), atol=1e-6)
    if weights:
        assert traced.attention.shape == (2, 4, T, T)
        assert traced.attention.future_weight_sum == pytest.approx(0.0, abs=1e-6) or make is bert_layer
    else:
        assert traced.attention is None and "attention weights are not visible" in traced.notes[0]
    from blocktrace.diagnose.health import evaluate

    assert [f for f in evaluate([traced]) if f.level == "error"] == []
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in block.modules()) == 0


def test_a_gpt2_block_without_its_mask_is_flagged_as_leaking():
    from blocktrace.diagnose.health import evaluate

    block, _, _ = gpt2_block()
    forgot = evaluate([trace(block, X, checks=True, forward_kwargs={})])  # called with no mask: HF attends ahead
    assert any(f.name == "causal_leak" and f.step == "attn" for f in forgot)
    supplied = evaluate([trace(block, X, checks=True)])  # traced bare, blocktrace builds the mask its model would
    assert not any(f.name == "causal_leak" for f in supplied)


class Renamed(nn.Module):
    """Post-LN, with names no layout knows."""

    def __init__(self):
        super().__init__()
        self.mix, self.first_norm = nn.Linear(D, D), nn.LayerNorm(D)
        self.think, self.second_norm = nn.Linear(D, D), nn.LayerNorm(D)
        self.unused = nn.Linear(D, D)

    def forward(self, x):
        x = self.first_norm(x + self.mix(x))
        return self.second_norm(x + self.think(x))


def test_named_steps_post_ln_and_a_hook_that_never_fired():
    from blocktrace.errors import UsageError

    block = Renamed().eval()
    names = {"norm1": "first_norm", "attn": "mix", "norm2": "second_norm", "ffn": "think"}
    traced = trace(block, X, keep_tensors=True, steps=names, placement="post")
    assert [s.name for s in traced.steps] == ["attn", "residual1", "norm1", "ffn", "residual2", "norm2"]
    t = {s.name: s.tensor for s in traced.steps}
    assert torch.allclose(t["residual1"], X + block.mix(X).detach(), atol=1e-6)
    unfired = trace(block, X, steps={**names, "ffn": "unused"}, placement="post")
    assert unfired.missing == ["ffn"] and any("never fired: ffn" in note for note in unfired.notes)
    with pytest.raises(UsageError, match="cannot tell the steps of Renamed"):
        trace(block, X)


def test_my_implementation_against_the_reference_with_diff(invoke, tmp_path):
    """HF's GPT2Block traced as a user block, against blocktrace's own block on the same weights."""
    from safetensors.torch import save_file

    model = make_gpt2(head=False)
    model.save_pretrained(tmp_path / "ckpt")
    x = torch.randn(1, 5, 32, generator=torch.Generator().manual_seed(4))
    reference = trace(model.h[1], x, keep_tensors=True,
                      forward_kwargs={"attention_mask": torch.full((5, 5), -1e30).triu(1)[None, None]})
    save_trace(reference, tmp_path / "hf.safetensors")
    save_file({"x": x}, str(tmp_path / "x.safetensors"))
    ours = invoke("run", "--weights", str(tmp_path / "ckpt"), "--layer", "1", "--input", str(tmp_path / "x.safetensors"),
                  "--save", str(tmp_path / "ours.safetensors"))
    assert ours.exit_code == 0, ours.output
    result = invoke("diff", str(tmp_path / "ours.safetensors"), str(tmp_path / "hf.safetensors"), "--json")
    report = json.loads(result.stdout)
    assert result.exit_code == 0 and report["diverged"] is False, report
    assert [s["name"] for s in report["steps"]] == ["x", *SIX, "attn_weights"]


def test_module_leaves_sys_path_and_sys_modules_as_they_were(invoke, tmp_path, monkeypatch):
    block = ("import torch\nfrom torch import nn\n"
             "class B(nn.Module):\n"
             "    def __init__(self, scale):\n"
             "        super().__init__()\n"
             "        self.ln1, self.ln2 = nn.LayerNorm(16), nn.LayerNorm(16)\n"
             "        self.attn, self.ffn = nn.Linear(16, 16), nn.Linear(16, 16)\n"
             "        self.scale = scale\n"
             "    def forward(self, x):\n"
             "        x = x + self.attn(self.ln1(x))\n"
             "        return x + self.scale * self.ffn(self.ln2(x))\n"
             "def make():\n"
             "    torch.manual_seed(0)\n"
             "    return B({scale})\n")
    outputs = []
    for name, scale in (("one", 1.0), ("two", 5.0)):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "ub.py").write_text(block.replace("{scale}", str(scale)))
        monkeypatch.chdir(directory)
        path_before = list(sys.path)
        outputs.append(invoke("run", "--module", "ub:make", "--json"))
        assert sys.path == path_before and "ub" not in sys.modules
    first, second = (strict_json(r.stdout)["steps"][-1]["stats"]["rms"] for r in outputs)
    assert first != second  # the second directory's own block, not the cached first one


def test_module_keeps_the_packages_of_a_virtual_environment_below_the_working_directory(invoke, tmp_path,
                                                                                       monkeypatch):
    """Once: run from a project holding its .venv, --module forgot transformers' own modules (they live below
    the working directory too) and the next import of them crashed."""
    packages = tmp_path / ".venv" / "lib" / "site-packages"
    (packages / "venvpkg").mkdir(parents=True)
    (packages / "venvpkg" / "__init__.py").write_text("from torch import nn\nmake = lambda: nn.Identity()\n")
    (tmp_path / "userblock_v.py").write_text(
        "import torch\nfrom torch import nn\nimport venvpkg\n"
        "class B(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.ln1, self.ln2 = nn.LayerNorm(16), nn.LayerNorm(16)\n"
        "        self.attn, self.ffn = nn.Linear(16, 16), nn.Linear(16, 16)\n"
        "        self.extra = venvpkg.make()\n"
        "    def forward(self, x):\n"
        "        x = x + self.attn(self.ln1(x))\n"
        "        return x + self.ffn(self.ln2(x))\n"
        "def make():\n"
        "    return B()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(packages))
    monkeypatch.delitem(sys.modules, "venvpkg", raising=False)
    assert invoke("run", "--module", "userblock_v:make", "--json").exit_code == 0
    assert "venvpkg" in sys.modules and "userblock_v" not in sys.modules
    sys.modules.pop("venvpkg")
