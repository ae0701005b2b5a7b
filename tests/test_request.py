"""request.py: the typed request the CLI builds — the input kinds given, in the order the options name them, and
which go through a checkpoint; the layer a run traces first."""

from pathlib import Path

from blocktrace.request import InputKind, InputSpec, RunRequest


def test_every_input_kind_has_its_field_and_the_kinds_given_are_listed():
    assert set(InputSpec.FIELDS.values()) == set(InputKind)
    assert InputSpec().given() == []
    spec = InputSpec(tokens="猫 吃", token_ids_file=Path("ids.npy"))
    assert spec.given() == [InputKind.TOKENS, InputKind.TOKEN_IDS_FILE]


def test_ids_and_text_go_through_a_checkpoint_tokens_and_tensors_do_not():
    through = {kind for kind in InputKind if kind.through_checkpoint}
    assert through == {InputKind.TOKEN_IDS, InputKind.TOKEN_IDS_FILE, InputKind.TEXT, InputKind.TEXT_FILE}


def test_a_run_traces_the_layer_asked_for_else_the_first():
    assert RunRequest(config_fields={}).first_layer == 0
    assert RunRequest(config_fields={}, layer=3).first_layer == 3
