"""The command-line options, in groups, and the request each command builds from them.

A new option goes here (its declaration and help), into cli/rules.py (what it needs and what
it excludes) and into `make_request`/`make_analysis` (where its value lands).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

import click
from tabulate import tabulate_formats

from blocktrace.render.documents import DOCUMENTS
from blocktrace.request import MAX_WINDOWS, Analysis, InputSpec, RunRequest
from blocktrace.sizing import MAX_BATCHES, MAX_LAYERS, MAX_TOKENS, MAX_WIDTH
from blocktrace.sources.reading import parse_json
from blocktrace.vocab import DEFAULT_RAW_DTYPE, RAW_DTYPES, Device, DType, FFNKind, Init, Lang, Level, Norm, Placement
from blocktrace.wiring import WIRINGS, flag_parameter

SEED_MAX = 2**32 - 1  # derived seeds (seed + layer, seed + 10 000) stay far inside torch's range


def enum_choice(enum_cls) -> click.Choice:
    return click.Choice(enum_cls.values())


class OutputFile(click.Path):
    """A file to write: a name that ends in a separator (`dir/newdir/`) names a directory, refused by name — as a
    Path it would lose the separator and become a file `newdir`."""

    def __init__(self):
        super().__init__(dir_okay=False, path_type=Path)

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.endswith(("/", os.sep)):
            example = f"{value}report{_SUFFIXES.get(param.name, '')}"
            self.fail(f"{value} names a directory: give a file in it, e.g. {example}", param, ctx)
        return super().convert(value, param, ctx)


_SUFFIXES = {"html_path": ".html", "plot_path": ".png", "save_path": ".safetensors", "out": ".jsonl"}


class IntegerList(click.ParamType):
    """Comma-separated integers, each at least `minimum`: `--layers 6,8,10`, `--steps 0,100,200`."""

    name = "N[,N...]"

    def __init__(self, what: str, minimum: int, example: str, maximum: Optional[int] = None):
        self.what, self.minimum, self.maximum, self.example = what, minimum, maximum, example

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            numbers = tuple(int(part) for part in str(value).split(","))
        except ValueError:
            self.fail(f"{value!r} is not a {self.what} or a comma-separated list of them, e.g. {self.example}",
                      param, ctx)
        if any(number < self.minimum for number in numbers):
            self.fail(f"{value!r}: every {self.what} must be at least {self.minimum}", param, ctx)
        if self.maximum is not None and any(number > self.maximum for number in numbers):
            self.fail(f"{value!r}: every {self.what} must be at most {self.maximum}", param, ctx)
        return numbers


class FiniteNumber(click.ParamType):
    """A finite number ≥ 0, or > 0 when `positive` (click's FloatRange lets NaN through: NaN < 0 is false)."""

    name = "float"

    def __init__(self, positive: bool):
        self.positive = positive

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or number < 0 or (self.positive and number == 0):
            self.fail(f"{value!r}: give a finite number {'>' if self.positive else '≥'} 0", param, ctx)
        return number


class StepNames(click.ParamType):
    """A JSON object of step name → submodule path."""

    name = "JSON"

    def convert(self, value, param, ctx):
        if isinstance(value, dict):
            return value
        try:
            names = parse_json(value)
        except ValueError as error:
            self.fail(f"not valid JSON ({error})", param, ctx)
        if not isinstance(names, dict) or not all(isinstance(v, str) for v in names.values()):
            self.fail('give a JSON object of step: submodule path, e.g. {"norm1": "ln_1"}', param, ctx)
        return names


def force_option(what: str):
    return click.option("--force", is_flag=True, help=f"Let {what} overwrite an existing regular file.")


def options(*decorators):
    def apply(function):
        for decorator in reversed(decorators):
            function = decorator(function)
        return function
    return apply


SEED_OPTION = click.option("--seed", type=click.IntRange(0, SEED_MAX), default=0, show_default=True, help="Seed of what is drawn at random (a random block's parameters and input; the --windows of a --token-ids-file): same seed, same numbers.")
BLOCK_OPTIONS = options(
    click.option("--d-model", type=click.IntRange(min=1, max=MAX_WIDTH), default=16, show_default=True, help="Width of the residual stream."),
    click.option("--heads", type=click.IntRange(min=1, max=MAX_WIDTH), default=4, show_default=True, help="Attention heads; must divide --d-model."),
    click.option("--d-ff", type=click.IntRange(min=1, max=MAX_WIDTH), default=None, help="FFN hidden width.  [default: 4 × d-model]"),
    click.option("--causal/--no-causal", default=True, show_default=True, help="Mask future tokens before the softmax."),
    click.option("--eps", type=FiniteNumber(positive=True), default=1e-5, show_default=True, help="Norm epsilon."),
    click.option("--bias/--no-bias", default=True, show_default=True, help="Biases on linear layers and LayerNorm."),
    SEED_OPTION,
    click.option("--init", type=enum_choice(Init), default=Init.DEFAULT.value, show_default=True, help="Parameter init: PyTorch's default, Xavier, or Xiong et al. 2020's setting (Xavier, zero biases, W^Q = W^K = 0)."),
)

TOKEN_IDS_OPTION = click.option("--token-ids", "token_ids_text", metavar="ID...", help="Token ids fed through the checkpoint's embeddings (and the blocks before the one traced); several sequences separated by / form a padded batch, e.g. 1 2 3 / 4 5.")
TOKEN_TYPES_OPTION = click.option("--token-type-ids", "token_types_text", metavar="ID...", help="BERT's token type (segment) ids, one per token of --token-ids or --text (several sequences separated by /).  [default: all 0]")
TEXT_OPTION = click.option("--text", default=None, help="Text tokenized by the tokenizer.json beside the checkpoint (needs the tokenizers package: pip install -e '.[text]'); the tokenizer's padding and truncation are switched off.")
TEXT_FILE_OPTION = click.option("--text-file", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Many sequences, one per line of a UTF-8 file, through the tokenizer.json beside the checkpoint: a padded batch (padding masked); lines longer than the model's positions become consecutive windows.")
IDS_FILE_OPTIONS = options(
    click.option("--token-ids-file", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Token ids from a file, no tokenizer needed: .npy (1-D stream or 2-D rows), .bin (raw integers as nanoGPT's prepare.py writes them), .json (a list, or a list of lists), or text (whitespace-separated ids, a sequence per line)."),
    click.option("--ids-dtype", type=click.Choice(RAW_DTYPES), default=DEFAULT_RAW_DTYPE, show_default=True, help="The integers of a raw .bin --token-ids-file."),
    click.option("--windows", type=click.IntRange(min=1, max=MAX_WINDOWS), default=None, help="Draw this many windows of --context ids from a --token-ids-file stream, at offsets fixed by --seed (as a training loop draws batches)."),
    click.option("--context", type=click.IntRange(min=1, max=MAX_TOKENS), default=None, help="The length of each --windows window.  [default: the model's positions]"),
)
INPUT_OPTIONS = options(
    click.option("--tokens", "tokens_text", metavar="TOKEN...", help="Input tokens, e.g. --tokens 猫 吃 鱼 (seeded embedding + sinusoidal positions)."),
    click.option("--seq-len", type=click.IntRange(min=1, max=MAX_TOKENS), default=None, help="Random input of this many tokens (when no --tokens).  [default: 5]"),
    click.option("--batch", type=click.IntRange(min=1), default=None, help="Add a batch dimension of this size; without it x is [T, d-model]."),
    click.option("--weights", type=click.Path(path_type=Path), default=None, help="A checkpoint: a HuggingFace directory (model.safetensors or a sharded index, and config.json), a .safetensors file, a nanoGPT/Lightning/torch .pt or .ckpt (read without running pickled code), or a model id already in the local HuggingFace cache (never downloaded). Its config.json's model_type says the family: GPT-2, BERT, GPT-NeoX, Llama, Mistral, Ministral, Qwen2/3, Qwen-MoE, Mixtral, OLMo-2/3, OLMoE, Gemma 1–3, Phi-3, StarCoder2, Granite, SmolLM3, EXAONE-4, Cohere 1–2, gpt-oss, DeepSeek-V2/V3, Llama-4, LFM2, Seed-OSS, ERNIE-4.5, GLM-4.5, MiniMax-M2, Qwen3-Next, Granite-4, Hunyuan (dense and MoE), Apertus, Helium, Arcee, GLM-4, dots.llm1, EXAONE-MoE, OLMo-Hybrid, Qwen3.5 and Qwen3.5-MoE (their language models) (`blocktrace inspect` lists what it found)."),
    click.option("--layer", type=click.IntRange(min=0), default=0, show_default=True, help="Which block of --weights to trace (the first, with --layers)."),
    TOKEN_IDS_OPTION, TOKEN_TYPES_OPTION, TEXT_OPTION, TEXT_FILE_OPTION, IDS_FILE_OPTIONS,
    click.option("--input", "input_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Exact block input: a .safetensors file holding 'x' (or one tensor), [T, d] or [B, T, d]."),
)

DTYPE_OPTION = click.option("--dtype", type=enum_choice(DType), default=DType.FLOAT32.value, show_default=True, help="Compute dtype (checkpoints in half precision are upcast unless this says otherwise).")
DEVICE_OPTION = click.option("--device", type=enum_choice(Device), default=Device.CPU.value, show_default=True, help="Where to run; auto picks cuda when available.")
ATTN_CHUNK_OPTION = click.option("--attn-chunk", type=click.IntRange(min=1), default=None, help="Query rows the attention computes at once, to bound memory on long inputs.  [default: as many as fit 8 MiB of scores on a CPU, 256 MiB on a GPU]")
COMPUTE_OPTIONS = options(DTYPE_OPTION, DEVICE_OPTION, ATTN_CHUNK_OPTION)

DEPTH_OPTIONS = options(
    click.option("--layers", "depths", type=IntegerList("depth", 1, "12 or 6,8,10", MAX_LAYERS), default=None, help="How many blocks, in every command: a stack of N (with --weights, the N layers from --layer) with a per-layer table, or several depths 6,8,10 for a gradient sweep (needs --grad)."),
    click.option("--grad", is_flag=True, help="One backward pass: gradient norms at every step and of every weight matrix (the loss: docs/compare.md)."),
    click.option("--batches", type=click.IntRange(min=1, max=MAX_BATCHES), default=1, show_default=True, help="With --grad: average the gradient over this many seeded mini-batches before taking norms."),
)

STEPS_OPTION = click.option("--block-steps", "show_steps", is_flag=True, help="With --layers: print every block's six steps (norm1 … residual2).")
QUIET_OPTION = click.option("--quiet", "-q", is_flag=True, help="No progress line on stderr (it is shown only on a terminal anyway).")
# One flag per document the report can be printed as instead of the tables (render/documents: a document kind
# is its module). "Format" is the tables' word: --format chooses their style.
DOCUMENT_OPTIONS = options(*[click.option(f.flag, f.parameter, is_flag=True, help=f.help) for f in DOCUMENTS])


class TableFormat(click.ParamType):
    """One of tabulate's formats, without listing all of them in every --help."""

    name = "FORMAT"

    def convert(self, value, param, ctx):
        if value not in tabulate_formats:
            self.fail(f"{value!r} is not a tabulate format; e.g. github, simple, plain, grid (all: "
                      f"{', '.join(tabulate_formats)})", param, ctx)
        return value


FORMAT_OPTION = click.option("--format", "fmt", type=TableFormat(), default="simple", show_default=True, help="Table format: any tabulate format (e.g. github, simple, plain, grid).")
LANG_OPTION = click.option("--lang", type=enum_choice(Lang), default=Lang.EN.value, show_default=True, help="Headings and explanations in English or Chinese.")
HTML_OPTION = click.option("--html", "html_path", type=OutputFile(), default=None, help="Also write the report as one self-contained HTML page (nothing fetched to view it): the steps drawn, attention heatmaps, findings linked to their layer and step, charts; every number the --json document's.")
# check and track print their findings in English; their --html page can start in Chinese (it switches either way).
PAGE_LANG_OPTION = click.option("--lang", type=enum_choice(Lang), default=Lang.EN.value, show_default=True, help="The language the --html page starts in (a button on it switches); the printed findings are English.")
PLOT_OPTION = click.option("--plot", "plot_path", type=OutputFile(), default=None, help="Write a PNG: attention heatmaps, or per-layer curves with --layers (needs the [plot] extra).")
NORM_OPTION = click.option("--norm", type=enum_choice(Norm), default=Norm.LAYERNORM.value, show_default=True, help="The normalisation of norm1 and norm2: LayerNorm, or RMSNorm (x / sqrt(mean(x²) + eps) · g).")
FFN_OPTION = click.option("--ffn", type=enum_choice(FFNKind), default=FFNKind.GELU_TANH.value, show_default=True, help="The FFN: gelu (exact), gelu_tanh (GPT-2's tanh approximation), relu, relu2 (max(0, x)²), swiglu (Llama: down(silu(gate)·up)), geglu (Gemma: down(gelu_tanh(gate)·up)), geglu_exact (the same with the exact GELU), swiglu_clamped (gpt-oss: down((clamp(up, ±7) + 1)·g·sigmoid(1.702·g)), g = min(gate, 7)) or xielu (Apertus: down(xIELU(up)), xIELU's two learned scalars at their initial 0.8).")
FAIL_ON_OPTION = click.option("--fail-on", type=enum_choice(Level), default=Level.ERROR.value, show_default=True, help="The finding level that makes the exit code 1.")
MODULE_OPTIONS = options(
    click.option("--module", "module_spec", metavar="PKG.MOD:FACTORY", default=None, help="Trace your own block: imports PKG.MOD (or a file, path/to/file.py:FACTORY) and calls FACTORY() for an nn.Module. This RUNS YOUR CODE."),
    click.option("--step-names", type=StepNames(), default=None, help='With --module, for a block of unknown layout: its submodules, e.g. \'{"norm1": "ln_1", "attn": "attn", "norm2": "ln_2", "ffn": "mlp"}\'.'),
)
SAVE_OPTION = click.option("--save", "save_path", type=OutputFile(), default=None, help="Write every step's tensor to this .safetensors file (one block).")
# One flag per placement, declared with its wiring (blocktrace.wiring.WIRINGS).
PLACEMENT_OPTIONS = options(*[click.option(wiring.flag, flag_parameter(wiring), is_flag=True, help=wiring.help)
                              for wiring in WIRINGS.values()])
PLACEMENT_FLAGS = {flag_parameter(wiring): placement for placement, wiring in WIRINGS.items()}
QK_NORM_OPTION = click.option("--qk-norm", is_flag=True, help="RMSNorm on each head's q and k before RoPE (Qwen3).")
# What run, check and compare share: the block, its input, where it runs, how many layers.
SOURCE_OPTIONS = options(BLOCK_OPTIONS, INPUT_OPTIONS, COMPUTE_OPTIONS, DEPTH_OPTIONS, QUIET_OPTION)
# One value of each axis compare can vary — the norms' placement, the norm, the FFN, the QK-norm — for run and check
# (compare sets them per variant through its axis flags instead).
AXIS_VALUE_OPTIONS = options(PLACEMENT_OPTIONS, NORM_OPTION, FFN_OPTION, QK_NORM_OPTION)
DISPLAY_OPTIONS = options(
    click.option("--values", "n_values", type=click.IntRange(min=1), default=None, help="Show the first N numbers of one token's vector at every step."),
    click.option("--token-index", type=int, default=0, show_default=True, help="Which token --values shows (first sequence of a batch)."),
    click.option("--explain", is_flag=True, help="Add one sentence per step on what it does and why."),
)

# Config fields by the parameter names click gives them.
OPTION_FIELDS = {"d_model": "d_model", "heads": "n_heads", "d_ff": "d_ff", "norm": "norm", "ffn": "ffn",
                 "placement": "placement", "causal": "causal", "eps": "eps", "bias": "bias", "qk_norm": "qk_norm"}
# Request fields a user may type without them being config fields.
TYPED_FIELDS = {"seed": "seed", "init": "init"}


def given(ctx: click.Context, name: str) -> bool:
    """Whether the user typed the option (not its default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source not in (click.core.ParameterSource.DEFAULT,
                                                   click.core.ParameterSource.DEFAULT_MAP)


def chosen_placement(ctx: click.Context) -> Placement:
    flags = [name for name in PLACEMENT_FLAGS if ctx.params.get(name)]
    if len(flags) > 1:
        shown = " and ".join("--" + name.replace("_", "-") for name in flags)
        raise click.UsageError(f"{shown} both set the wiring: give one of --pre-ln, --post-ln, --deepnorm, --sandwich")
    return PLACEMENT_FLAGS[flags[0]] if flags else Placement.PRE


def make_request(ctx: click.Context, params: dict, **config_fields) -> RunRequest:
    fields = dict(d_model=params["d_model"], n_heads=params["heads"], d_ff=params["d_ff"], causal=params["causal"],
                  eps=params["eps"], bias=params["bias"], **config_fields)
    explicit = {field for name, field in {**OPTION_FIELDS, **TYPED_FIELDS}.items()
                if name in ctx.params and given(ctx, name)}
    if "placement" in config_fields and any(given(ctx, flag) for flag in PLACEMENT_FLAGS):
        explicit.add("placement")
    inputs = InputSpec(tokens=params["tokens_text"], token_ids=params["token_ids_text"],
                       token_types=params["token_types_text"], text=params["text"], text_file=params["text_file"],
                       **ids_file_fields(params), input_path=params["input_path"], seq_len=params["seq_len"],
                       batch=params["batch"])
    return RunRequest(config_fields=fields, explicit=frozenset(explicit), inputs=inputs, seed=params["seed"],
                      init=Init(params["init"]), weights=params["weights"],
                      layer=params["layer"] if given(ctx, "layer") else None,
                      dtype=DType(params["dtype"]), device=Device(params["device"]), attn_chunk=params["attn_chunk"],
                      module=params.get("module_spec"), step_names=params.get("step_names"),
                      expect_causal=params["causal"] if params.get("module_spec") and given(ctx, "causal") else None)


def ids_file_fields(params: dict) -> dict:
    """The InputSpec fields of a --token-ids-file and its windows."""
    return dict(token_ids_file=params["token_ids_file"], ids_dtype=params["ids_dtype"], windows=params["windows"],
                context=params["context"], window_seed=params["seed"])


def make_analysis(params: dict, **extra) -> Analysis:
    depths = params["depths"] or (1,)
    return Analysis(depths=depths, stacked=params["depths"] is not None, grad=params["grad"],
                    batches=params["batches"], **extra)
