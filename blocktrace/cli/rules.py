"""Which options make sense together: an option that would be accepted and ignored is refused.

Every rule's message starts with the option at fault and says what it needs (or what it cannot go with), and
ends in exit code 2 before any work is done. A rule is data: (option, condition, message).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import click

from blocktrace.cli.options import PLACEMENT_FLAGS, given
from blocktrace.render.documents import DOCUMENTS

Condition = Callable[[click.Context], bool]


def typed(name: str) -> Condition:
    return lambda ctx: name in ctx.params and given(ctx, name)


def is_set(name: str) -> Condition:
    """The option has a value (a flag that is on, a path that was given)."""
    return lambda ctx: bool(ctx.params.get(name))


def any_of(*conditions: Condition) -> Condition:
    return lambda ctx: any(condition(ctx) for condition in conditions)


def all_of(*conditions: Condition) -> Condition:
    return lambda ctx: all(condition(ctx) for condition in conditions)


def depth_list(ctx: click.Context) -> bool:
    return len(ctx.params.get("depths") or ()) > 1


@dataclass(frozen=True)
class Needs:
    """`option` does something only when `condition` holds."""

    option: str  # the parameter name
    condition: Condition
    message: str

    def broken(self, ctx) -> bool:
        return typed(self.option)(ctx) and not self.condition(ctx)


@dataclass(frozen=True)
class Excludes:
    """`option` cannot go with what `condition` describes."""

    option: str
    condition: Condition
    message: str

    def broken(self, ctx) -> bool:
        return typed(self.option)(ctx) and self.condition(ctx)


# Parameter names whose option is spelled differently.
SPELLED = {"show_steps": "--block-steps", "fmt": "--format", **{f.parameter: f.flag for f in DOCUMENTS},
           "depths": "--layers",
           "n_values": "--values", "module_spec": "--module", "model_spec": "--model", "save_path": "--save",
           "check_only": "--check",
           "plot_path": "--plot", "html_path": "--html", "tokens_text": "--tokens", "token_types_text": "--token-type-ids",
           "input_path": "--input", "token_ids_text": "--token-ids",
           "causal": "--causal/--no-causal", "bias": "--bias/--no-bias", "heads": "--heads"}


def flag(name: str) -> str:
    return SPELLED.get(name, "--" + name.replace("_", "-"))


def beside_documents(option: str, tables: str, document: str = "prints no table") -> list["Excludes"]:
    """`option` refused beside each document kind (render/documents): "{tables}; --json {document}"."""
    return [Excludes(option, is_set(f.parameter), f"{tables}; {f.flag} {document}") for f in DOCUMENTS]


MODULE_REFUSES = {  # the user's block has its own wiring, sizes and parameters
    "heads": "the block has its own heads", "d_ff": "the block has its own FFN width",
    "norm": "the block has its own norms", "ffn": "the block has its own FFN", "eps": "the block has its own norms",
    "qk_norm": "the block has its own attention",
    "bias": "the block has its own parameters",
    "init": "the block has its own parameters", "attn_chunk": "the block's attention is its own code",
    "weights": "--weights loads blocktrace's own blocks", "layer": "--layer picks a layer of --weights",
    "depths": "--layers stacks blocktrace's own blocks", "grad": "--grad works on blocktrace's own blocks",
}


def force_needs(*outputs: str) -> Needs:
    """--force does something only with an output file to replace (the command's own output options)."""
    named = " or ".join(flag(name) for name in outputs)
    return Needs("force", any_of(*(is_set(name) for name in outputs)),
                 f"--force lets {named} replace an existing file: add {'one of them' if len(outputs) > 1 else 'it'}")


# What --token-ids-file's companions need, in every command that has them.
IDS_FILE_RULES = [
    Needs("ids_dtype", is_set("token_ids_file"), "--ids-dtype reads a raw .bin --token-ids-file: add one"),
    Needs("ids_dtype", lambda ctx: str(ctx.params.get("token_ids_file") or "").lower().endswith(".bin"),
          "--ids-dtype says how to read a raw .bin file; other --token-ids-file formats carry their own type"),
    Needs("windows", is_set("token_ids_file"), "--windows draws windows from a --token-ids-file: add one"),
    Needs("context", is_set("windows"), "--context is the length of each --windows window: add --windows N"),
    Excludes("batch", is_set("token_ids_file"), "--batch repeats one sequence; --token-ids-file gives a batch of "
             "its own (--windows N for N windows)"),
]

COMMON_RULES = [
    Needs("show_steps", is_set("depths"), "--block-steps prints every block of a stack: add --layers N"),
    Excludes("show_steps", depth_list, "--block-steps prints a stack's blocks; a depth list is a gradient sweep"),
    *IDS_FILE_RULES,
    Needs("batches", is_set("grad"), "--batches averages gradients: add --grad"),
    Excludes("batches", any_of(is_set("weights"), is_set("input_path"), is_set("tokens_text")),
             "--batches averages the gradient over fresh random mini-batches; the input given (--weights, --input, "
             "--tokens) is one batch, the same each time: drop --batches"),
    *beside_documents("show_steps", "--block-steps prints every block's step table", "holds every block's steps "
                      "anyway"),
    Needs("layer", is_set("weights"), "--layer picks a block of a checkpoint: add --weights PATH"),
    Needs("token_types_text", any_of(is_set("token_ids_text"), is_set("text")),
          "--token-type-ids go with the tokens of --token-ids or --text"),
    Excludes("batch", is_set("text_file"), "--batch repeats one sequence; --text-file gives a batch of its own"),
    Excludes("init", is_set("weights"), "--init draws random parameters; --weights loads the checkpoint's own"),
    *beside_documents("fmt", "--format shapes the tables"),
    *[Excludes("lang", all_of(is_set(f.parameter), lambda ctx: not is_set("html_path")(ctx)),
               f"--lang sets the words of the tables and of the --html page; {f.flag} prints no table")
      for f in DOCUMENTS],
    Excludes("seq_len", any_of(is_set("input_path"), is_set("token_ids_text"), is_set("text"), is_set("text_file"),
                               is_set("token_ids_file")),
             "--seq-len sets the length of random input; the input given sets its own length"),
    Needs("depths", lambda ctx: len(ctx.params.get("depths") or ()) < 2 or bool(ctx.params.get("grad")),
          "--layers with a list of depths is a gradient sweep: add --grad (or give one depth)"),
]

RUN_RULES = [
    *COMMON_RULES,
    force_needs("save_path", "plot_path", "html_path"),
    Excludes("seed", lambda ctx: bool(ctx.params.get("weights")) and not ctx.params.get("windows"),
             "--seed draws random parameters and input (or --windows); --weights loads the checkpoint's own and its "
             "input comes from --token-ids, --token-ids-file, --text or --input"),
    Needs("fail_on", is_set("check_only"), "--fail-on sets the level at which --check exits 1: add --check"),
    Needs("token_index", is_set("n_values"), "--token-index picks the token --values shows: add --values N"),
    Excludes("n_values", is_set("depths"), "--values shows one block's steps; with --layers use --json"),
    *beside_documents("explain", "--explain adds sentences to the tables"),
    Excludes("explain", depth_list, "--explain describes a block's steps; a depth list is a gradient sweep"),
    Excludes("save_path", is_set("depths"), "--save writes one block's steps: drop --layers"),
    Excludes("save_path", lambda ctx: bool(ctx.params.get("check_only") and ctx.params.get("weights")),
             "--save writes one block's steps; --check --weights checks the whole model: use run --save"),
    Needs("step_names", is_set("module_spec"), "--step-names names the steps of a block given with --module"),
    *[Excludes(name, is_set("check_only"), f"{flag(name)} shapes the table; --check prints only the findings")
      for name in ("explain", "n_values", "token_index", "lang", "show_steps")],
    Excludes("check_only", depth_list, "--check checks blocks; a depth list is a gradient sweep"),
    *[Excludes(name, is_set("module_spec"), f"{flag(name)} does not apply with --module: {why}")
      for name, why in MODULE_REFUSES.items()],
    *[Excludes(name, lambda ctx: bool(ctx.params.get("module_spec")) and not ctx.params.get("step_names"),
               f"{flag(name)} sets blocktrace's wiring; a --module block has its own (with --step-names it says "
               "how the named steps are wired)")
      for name in PLACEMENT_FLAGS],
]

CHECK_RULES = [rule for rule in RUN_RULES if rule.option not in ("fail_on", "force") and not (
    isinstance(rule, Excludes) and rule.message.endswith("--check prints only the findings"))]
# check and track print English findings: their --lang is the language their --html page starts in.
PAGE_LANG_RULE = Needs("lang", is_set("html_path"), "--lang sets the words of the --html page; add --html FILE")
CHECK_RULES += [force_needs("html_path"), PAGE_LANG_RULE]
CHECK_RULES.append(Excludes("depths", depth_list, "--layers: check checks blocks; a depth list is a gradient sweep"))

COMPARE_RULES = [
    *COMMON_RULES,
    force_needs("plot_path", "html_path"),
    *beside_documents("explain", "--explain adds sentences to the tables"),
    Excludes("explain", is_set("depths"), "--explain describes one block's steps; with --layers compare shows "
             "per-layer tables"),
    Excludes("plot_path", lambda ctx: not ctx.params.get("depths"),
             "--plot with compare draws per-layer curves: add --layers N"),
]


# What `check --model` takes: the model's own code computes everything else (wiring, dtype, layers, gradients).
MODEL_TAKES = ("model_spec", "weights", "token_ids_text", "token_ids_file", "ids_dtype", "windows", "context", "seed",
               "text", "text_file", "fail_on", "fmt", "quiet", *(f.parameter for f in DOCUMENTS))


def refuse_beside_model(ctx: click.Context) -> None:
    """With --model, an option blocktrace's own blocks would read is refused by name: the user's code ignores it."""
    if not ctx.params.get("model_spec"):
        return
    if not ctx.params.get("weights"):
        raise click.UsageError("--model runs your model on its checkpoint: add --weights PATH")
    extra = next((name for name in ctx.params if name not in MODEL_TAKES and given(ctx, name)), None)
    if extra is not None:
        raise click.UsageError(f"{flag(extra)} does not apply with --model: your model's own code computes it "
                               f"(--model takes {', '.join(flag(name) for name in MODEL_TAKES[1:])})")
    enforce(ctx, IDS_FILE_RULES)


def enforce(ctx: click.Context, rules) -> None:
    for rule in rules:
        if rule.broken(ctx):
            raise click.UsageError(rule.message)
