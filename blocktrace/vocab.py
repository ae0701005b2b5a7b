"""The tool's fixed vocabularies: step names and every enum an option or a report uses.

Torch-free on purpose: the CLI builds its choices and `--help` from here, and `blocktrace
--help` must answer without paying for `import torch`. Code compares enum members, never
their strings; the strings appear only at the edges (options, JSON, tables).
"""

from __future__ import annotations

from enum import Enum

# The vocabulary of the whole tool: module names, table rows, JSON keys, saved tensor names.
STEP_NAMES = ("norm1", "attn", "residual1", "norm2", "ffn", "residual2")
# Sandwich (Peri-LN, Gemma-2) wiring normalises each sublayer's output too, before its residual add.
SANDWICH_STEPS = ("post_attn_norm", "post_ffn_norm")
NORM_STEPS = ("norm1", "norm2", *SANDWICH_STEPS)
# The weight matrices whose gradients are reported, by the names the tables and JSON use.
WEIGHT_NAMES = ("attn_q", "attn_k", "attn_v", "attn_o", "ffn_w1", "ffn_w2")
# The version of every JSON document blocktrace prints (docs/tutorial.md: Scripting); 2 renamed two keys
# (docs/reference.md: Documents and their versions).
SCHEMA_VERSION = 2

IGNORE_INDEX = -100  # F.cross_entropy's and HF's ignore_index: a target that the loss does not count


class Choice(str, Enum):
    """An enum whose values are what users type and what JSON carries."""

    @classmethod
    def values(cls) -> list[str]:
        return [member.value for member in cls]

    def __str__(self) -> str:
        return self.value


class Norm(Choice):
    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


class FFNKind(Choice):
    GELU = "gelu"  # exact: 0.5·x·(1 + erf(x/√2))
    GELU_TANH = "gelu_tanh"  # GPT-2's "gelu_new" tanh approximation
    RELU = "relu"
    RELU2 = "relu2"  # max(0, x)² (So et al. 2021, Primer; Arcee's and Nemotron's MLPs)
    SWIGLU = "swiglu"  # Shazeer 2020: down(silu(gate(x)) · up(x))
    GEGLU = "geglu"  # Gemma: down(gelu_tanh(gate(x)) · up(x))
    GEGLU_EXACT = "geglu_exact"  # Gemma-2 with hidden_activation "gelu": down(gelu(gate(x)) · up(x))
    # gpt-oss: down((clamp(up, ±L) + 1) · g·sigmoid(α·g)) with g = min(gate, L) (BlockConfig's glu_clamp)
    SWIGLU_CLAMPED = "swiglu_clamped"
    # Apertus: down(xIELU(up(x))), xIELU with two learned scalars per layer (Huang & Schlag 2024, arXiv 2411.13010)
    XIELU = "xielu"

    @property
    def gated(self) -> bool:
        return self in (FFNKind.SWIGLU, FFNKind.GEGLU, FFNKind.GEGLU_EXACT, FFNKind.SWIGLU_CLAMPED)

    @property
    def zero_below(self) -> bool:
        """Whether every negative pre-activation gives exactly 0 (a unit can die)."""
        return self in (FFNKind.RELU, FFNKind.RELU2)

    @property
    def plain(self) -> bool:
        """Two matrices around a fixed function (GPT-2's, BERT's MLP): no gate, no weights in the activation."""
        return not self.gated and self is not FFNKind.XIELU

    @property
    def signed_hidden(self) -> bool:
        """Whether a hidden unit's output takes both signs wherever it is active, so that it is dead only when it is
        ~0 for every token (a gated unit; xIELU, whose slope is nowhere 0); else it is dead when never positive."""
        return self.gated or self is FFNKind.XIELU


class MixerKind(Choice):
    """A token mixer that is not attention (config.TOKEN_MIXERS holds each one's spec)."""

    SHORT_CONV = "short_conv"  # LFM2's gated short convolution
    GATED_DELTA = "gated_delta"  # Qwen3-Next's gated delta rule (Gated DeltaNet)
    MAMBA2 = "mamba2"  # Granite-4's Mamba-2 selective state space


class QKSpan(Choice):
    """What one QK-norm normalises: each head's q (and k) by itself, or all heads' at once before the split."""

    HEAD = "head"  # Qwen3, Gemma-3, Hunyuan, Llama-4
    ALL_HEADS = "all_heads"  # OLMo-2, MiniMax-M2


class RouterKind(Choice):
    """How a mixture of experts' router turns its logits into each token's experts and their weights."""

    SOFTMAX = "softmax"  # Mixtral, Qwen, OLMoE, gpt-oss: the top-k of softmax(logits), optionally renormalised
    # DeepSeek-V2's group_limited_greedy: softmax, then only the experts of the groups with the largest maximum
    SOFTMAX_GROUPED = "softmax_grouped"
    # DeepSeek-V3: sigmoid scores; the choice adds a bias and keeps the groups whose two best sum highest; the
    # weights are the chosen scores without the bias
    SIGMOID_GROUPED = "sigmoid_grouped"
    # Llama-4: the top-k logits' sigmoids scale each chosen expert's input (not its output)
    SIGMOID_TOPK = "sigmoid_topk"
    # ERNIE-4.5: softmax in float32; the choice adds a bias to the probabilities, the weights are the chosen
    # probabilities without it, renormalised
    SOFTMAX_BIASED = "softmax_biased"

    @property
    def grouped(self) -> bool:
        return self in (RouterKind.SOFTMAX_GROUPED, RouterKind.SIGMOID_GROUPED)


class RopeKind(Choice):
    """How RoPE's frequencies are stretched past the context a model was trained on (HF's rope_type)."""

    LINEAR = "linear"  # positions divided by the factor (Chen et al. 2023, position interpolation)
    DYNAMIC = "dynamic"  # NTK-aware: the base grows with the length, only past max_position_embeddings
    YARN = "yarn"  # Peng et al. 2023: low frequencies interpolated, high ones kept, cos/sin scaled
    LONGROPE = "longrope"  # Ding et al. 2024 (Phi-3): a factor per frequency, short or long by length
    LLAMA3 = "llama3"  # Llama 3.1: low frequencies divided by the factor, a smooth band between


class Placement(Choice):
    PRE = "pre"  # GPT-2, Llama: x + f(norm(x))
    POST = "post"  # original Transformer, BERT: norm(x + f(x))
    DEEPNORM = "deepnorm"  # Wang et al. 2022: norm(α·x + f(x)), α = (2N)^¼ for N decoder blocks
    SANDWICH = "sandwich"  # Peri-LN, Gemma-2: x + norm_out(f(norm_in(x)))
    REORDERED = "reordered"  # OLMo-2 (Swin v2's res-post-norm): x + norm(f(x)), the norm on each update only
    # Which step reads which under each placement: blocktrace.wiring.


class Parallel(Choice):
    """Whether attn and ffn read the block's input side by side (a parallel residual), and under how many norms."""

    OFF = "off"  # ffn reads the stream after attn's update (GPT-2, Llama)
    TWO_NORMS = "two_norms"  # GPT-NeoX: x + attn(norm1(x)) + ffn(norm2(x))
    ONE_NORM = "one_norm"  # Cohere (GPT-J's, Falcon-7B's too): x + attn(norm1(x)) + ffn(norm1(x)), no norm2


class Init(Choice):
    DEFAULT = "default"  # PyTorch's own
    XAVIER = "xavier"
    XIONG = "xiong"  # Xiong et al. 2020: Xavier, zero biases, W^Q = W^K = 0


class DType(Choice):
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"


class Device(Choice):
    CPU = "cpu"
    CUDA = "cuda"
    AUTO = "auto"  # cuda when available


class Lang(Choice):
    EN = "en"
    ZH = "zh"


class Capture(Choice):
    """Which value of a module a step is: what it returns, or its first argument."""

    OUTPUT = "output"
    INPUT = "input"


class Level(Choice):
    """How bad a health-check finding is; ordered."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return list(Level).index(self)

    def reaches(self, threshold: "Level") -> bool:
        return self.rank >= threshold.rank


class ReportKind(Choice):
    """What a report dict describes (its "kind" key): each renderer draws one of these."""

    BLOCK = "block"  # one block's six steps
    STACK = "stack"  # --layers N: per layer
    SWEEP = "sweep"  # --layers 6,8,... --grad: per depth
    COMPARE = "compare"  # two variants side by side
    DIFF = "diff"  # two trace files step by step
    MODEL = "model"  # a checkpoint as a whole model: its layers, its loss
    TRACK = "track"  # a run over training: its records, the first sign, the rollback point
    INSPECT = "inspect"  # a checkpoint's layout, config and tensors, nothing run


class Axis(Choice):
    """A design axis `compare` varies; the value is the BlockConfig field it sets."""

    PLACEMENT = "placement"
    NORM = "norm"
    FFN = "ffn"
    QK_NORM = "qk_norm"


class Exterior(Choice):
    """The model's input and output layers, which Muon's definition leaves to AdamW (diagnose/audit.py)."""

    EMBEDDING = "embedding"
    HEAD = "head"


QK_NORM_VALUES = ("off", "on")  # how compare names the two QK-norm variants


# The integer dtypes a raw .bin --token-ids-file may hold (numpy names), uint16 first: nanoGPT's and most
# GPT-2-vocabulary data. Here, below both the request and the reader of those files, which name them.
RAW_DTYPES = ("uint16", "uint32", "int32", "int64", "uint8")
DEFAULT_RAW_DTYPE = RAW_DTYPES[0]
