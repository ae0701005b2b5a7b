"""What a command was asked, as typed values: the one object the CLI builds and the pipeline reads.

Torch-free (the CLI imports it to build requests before anything heavy is loaded). Every
field is set by keyword; options that make no sense together are refused in cli/rules.py,
so the pipeline can trust what it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from blocktrace.vocab import DEFAULT_RAW_DTYPE, Choice, Device, DType, Init, Level, Placement

DEFAULT_SEQ_LEN = 5
MAX_WINDOWS = 4096  # --windows: more windows than this is a training run, not a check
TIMELINE_SUFFIXES = (".jsonl", ".ndjson")  # a file track reads as a Watch's timeline, not as a checkpoint
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")  # a name ending so is a file, never a model id
# The first bytes of what torch.save writes: a zip archive, or (the legacy format) a pickle's protocol 2–5 opcode
TORCH_FILE_HEADS = (b"PK", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


def is_timeline(path: Path) -> bool:
    return Path(path).suffix.lower() in TIMELINE_SUFFIXES


def starts_like_torch_save(path: Path) -> bool:
    """Whether a file's first bytes are torch.save's (TORCH_FILE_HEADS); False for one that cannot be read."""
    try:
        with open(path, "rb") as handle:
            return handle.read(2).startswith(TORCH_FILE_HEADS)
    except OSError:
        return False


def may_hold_weights(path: Path) -> bool:
    """Whether a path could be a checkpoint: anything but a regular file whose name and first bytes say it is none
    (no weight suffix, neither torch.save's zip or pickle nor safetensors' 8-byte length and JSON header). A path
    that cannot be read is left to the reader, which says why."""
    path = Path(path)
    if path.suffix.lower() in WEIGHT_SUFFIXES or not path.is_file():
        return True
    try:
        with open(path, "rb") as handle:
            head = handle.read(9)
        size = path.stat().st_size
    except OSError:
        return True
    safetensors = len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < size
    return safetensors or head.startswith(TORCH_FILE_HEADS)


class InputKind(Choice):
    """Where a block's input comes from; the value is the option that gives it, as messages name it."""

    TOKENS = "--tokens"  # seeded embeddings of words (no weights)
    TOKEN_IDS = "--token-ids"
    TOKEN_IDS_FILE = "--token-ids-file"
    TEXT = "--text"
    TEXT_FILE = "--text-file"
    TENSOR = "--input"  # the exact block input, a safetensors file

    @property
    def through_checkpoint(self) -> bool:
        """Token ids, however given: they need the checkpoint's embeddings (and, for text, its tokenizer)."""
        return self in (InputKind.TOKEN_IDS, InputKind.TOKEN_IDS_FILE, InputKind.TEXT, InputKind.TEXT_FILE)


@dataclass(frozen=True)
class InputSpec:
    """Where the block input comes from: at most one of tokens, token ids (typed or in a file), text or a tensor
    file."""

    tokens: Optional[str] = None  # --tokens 猫 吃 鱼: seeded embeddings (no weights)
    token_ids: Optional[str] = None  # --token-ids 1 2 3 [/ 4 5]: through the checkpoint's embeddings
    token_types: Optional[str] = None  # --token-type-ids 0 0 1 [/ 0 1]: BERT's segment ids, one per token
    text: Optional[str] = None  # --text: the checkpoint's tokenizer
    text_file: Optional[Path] = None  # --text-file: one sequence per line, through the checkpoint's tokenizer
    token_ids_file: Optional[Path] = None  # --token-ids-file: ids as training code keeps them (.npy, .bin, ...)
    ids_dtype: str = DEFAULT_RAW_DTYPE  # --ids-dtype: the integers of a raw .bin
    windows: Optional[int] = None  # --windows N: windows drawn from a long stream of ids
    context: Optional[int] = None  # --context: a window's length  [default: the model's positions]
    window_seed: int = 0  # --seed: where the windows are drawn
    input_path: Optional[Path] = None  # --input FILE.safetensors: the exact block input
    seq_len: Optional[int] = None  # random input of this many tokens
    batch: Optional[int] = None  # a batch dimension of this size

    FIELDS = {"tokens": InputKind.TOKENS, "token_ids": InputKind.TOKEN_IDS, "text": InputKind.TEXT,
              "text_file": InputKind.TEXT_FILE, "token_ids_file": InputKind.TOKEN_IDS_FILE,
              "input_path": InputKind.TENSOR}

    def given(self) -> list[InputKind]:
        """The kinds of input given (more than one is refused where the input is read)."""
        return [kind for name, kind in self.FIELDS.items() if getattr(self, name) is not None]


@dataclass(frozen=True)
class RunRequest:
    """Everything `run`, `check` or `compare` was asked about the block and its input.

    `explicit` names the config fields the user typed: only those may override a checkpoint.
    """

    config_fields: dict
    explicit: frozenset = frozenset()
    inputs: InputSpec = field(default_factory=InputSpec)
    seed: int = 0
    init: Init = Init.DEFAULT
    weights: Optional[Path] = None
    layer: Optional[int] = None  # --layer: the checkpoint layer; None: run traces layer 0, check every layer
    dtype: DType = DType.FLOAT32
    device: Device = Device.CPU
    attn_chunk: Optional[int] = None  # query rows per attention chunk; None: the memory budget decides
    module: Optional[str] = None  # --module PKG.MOD:FACTORY: the user's own block
    step_names: Optional[dict] = None  # --step-names: its norm1/attn/norm2/ffn submodules
    expect_causal: Optional[bool] = None  # --causal / --no-causal with --module: what the block is meant to be
    training_step: Optional[int] = None  # the checkpoint's training step when known (track --steps); else its name

    @property
    def first_layer(self) -> int:
        """The checkpoint layer run traces first: the one asked for, else 0."""
        return self.layer if self.layer is not None else 0


@dataclass(frozen=True)
class Analysis:
    """What to compute besides the trace."""

    depths: tuple[int, ...] = (1,)  # one depth: a block or a stack; several: a gradient sweep
    stacked: bool = False  # --layers was given: report per layer even for one block
    grad: bool = False
    batches: int = 1
    keep_tensors: bool = False
    n_values: Optional[int] = None
    token_index: int = 0
    checks: bool = False  # health checks (diagnose.health): flags column, `check`
    attention_map: bool = False  # long inputs' attention pooled into a map, for a page that draws it (--html)
    placement: Placement = Placement.PRE  # where the norms of a user's block with named steps sit


@dataclass(frozen=True)
class TrackRequest:
    """What `track` was asked: one timeline, or checkpoints traced on one input (`run` holds the input, dtype and
    device), and what to judge them with."""

    sources: tuple[Path, ...]
    run: RunRequest = field(default_factory=lambda: RunRequest(config_fields={}))
    steps: Optional[tuple[int, ...]] = None  # --steps: each checkpoint's step, in the order given
    grad: bool = False
    log: Optional[Path] = None  # --log: a training log's numbers beside each record
    against: Optional[Path] = None  # --against: a healthy run, of the same kind as the sources
    fail_on: Level = Level.ERROR  # the level of the first sign of trouble (and of the exit code)

    @property
    def timeline(self) -> bool:
        """Whether the sources are one Watch timeline (else checkpoints)."""
        return len(self.sources) == 1 and is_timeline(self.sources[0])

