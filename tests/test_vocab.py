"""vocab.py: the enums every option and report uses — a gated FFN kind is one whose block has a gate matrix, the
levels are ordered, an enum's values are the choices its option offers."""

import pytest

from blocktrace.cli import cli
from blocktrace.config import BlockConfig
from blocktrace.model.block import build_block
from blocktrace.vocab import Device, DType, FFNKind, Init, Lang, Level, Norm


@pytest.mark.parametrize("kind", list(FFNKind))
def test_an_ffn_kind_is_gated_exactly_when_its_block_has_a_gate_matrix(kind):
    block = build_block(BlockConfig(d_model=8, n_heads=2, ffn=kind))
    assert kind.gated == hasattr(block.ffn, "gate")


def test_levels_are_ordered_and_a_level_reaches_itself_and_those_below():
    assert [level.rank for level in (Level.INFO, Level.WARNING, Level.ERROR)] == [0, 1, 2]
    reached = {(a.value, b.value) for a in Level for b in Level if a.reaches(b)}
    assert reached == {("info", "info"), ("warning", "info"), ("warning", "warning"), ("error", "info"),
                       ("error", "warning"), ("error", "error")}


@pytest.mark.parametrize("option, enum", [("norm", Norm), ("ffn", FFNKind), ("init", Init), ("dtype", DType),
                                          ("device", Device), ("lang", Lang), ("fail_on", Level)])
def test_an_options_choices_are_its_enums_values(option, enum):
    run = cli.commands["run"]
    (parameter,) = [p for p in run.params if p.name == option]
    assert list(parameter.type.choices) == enum.values() and str(enum.values()[0]) == enum.values()[0]
