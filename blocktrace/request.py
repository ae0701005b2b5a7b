"""What a command was asked, as typed values: the one object the CLI builds and the pipeline reads.

Torch-free (the CLI imports it to build requests before anything heavy is loaded). Every
field is set by keyword; options that make no sense together are refused in cli/rules.py,
so the pipeline can trust what it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from blocktrace.vocab import DEFAULT_RAW_DTYPE, Device, DType, Init, Placement

DEFAULT_SEQ_LEN = 5


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

    OPTION_NAMES = {"tokens": "--tokens", "token_ids": "--token-ids", "text": "--text", "text_file": "--text-file",
                    "token_ids_file": "--token-ids-file", "input_path": "--input"}

    def given(self) -> list[str]:
        """The options that give the input, as the user typed them."""
        return [option for name, option in self.OPTION_NAMES.items() if getattr(self, name) is not None]


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
    layer: int = 0
    dtype: DType = DType.FLOAT32
    device: Device = Device.CPU
    attn_chunk: Optional[int] = None  # query rows per attention chunk; None: the memory budget decides
    module: Optional[str] = None  # --module PKG.MOD:FACTORY: the user's own block
    step_names: Optional[dict] = None  # --step-names: its norm1/attn/norm2/ffn submodules
    expect_causal: Optional[bool] = None  # --causal / --no-causal with --module: what the block is meant to be
    training_step: Optional[int] = None  # the checkpoint's training step when known (track --steps); else its name


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
    placement: Placement = Placement.PRE  # the wiring of a user's block with named steps
