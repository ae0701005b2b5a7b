"""blocktrace/cli/app.py: the one output stage — a document kind is one module of render/documents that the options
and show read."""
from __future__ import annotations

import pytest


def test_a_document_kind_is_one_module_that_show_and_the_options_read(monkeypatch, capsys):
    """render/documents: --json is json_document.py's DOCUMENT; show renders whichever document the options chose,
    and two documents at once are refused (a kind added as a module of that package gets its flag the same way)."""
    import blocktrace.render.documents as documents
    from blocktrace.cli.app import show
    from blocktrace.cli.options import DOCUMENT_OPTIONS
    from blocktrace.errors import UsageError

    assert [f.flag for f in documents.DOCUMENTS] == ["--json"] and documents.DOCUMENTS[0].parameter == "as_json"
    assert documents.DOCUMENTS[0].render.__module__ == "blocktrace.render.documents.json_document"

    @DOCUMENT_OPTIONS
    def command(**params):
        return params

    assert [p.opts for p in command.__click_params__] == [["--json"]]
    shouting = documents.Document("--shout", "Every key in capitals.", lambda report: str(sorted(report)).upper())
    monkeypatch.setattr(documents, "DOCUMENTS", [*documents.DOCUMENTS, shouting])
    show({"kind": "block"}, {"as_shout": True}, lambda: "the tables")
    assert capsys.readouterr().out == "['KIND']\n"
    show({"kind": "block"}, {}, lambda: "the tables")
    assert capsys.readouterr().out == "the tables"
    with pytest.raises(UsageError, match="--json and --shout each print the whole report: choose one"):
        show({"kind": "block"}, {"as_json": True, "as_shout": True}, lambda: "")


def test_every_commands_document_says_its_schema_and_kind(invoke, tmp_path):
    """docs/reference.md: every --json document has `schema` 2 (the version that renamed layout → family and
    first_flag → first_sign) and a `kind` naming what it describes."""
    import json

    from helpers import SAMPLES

    tiny, run = SAMPLES / "gpt2-tiny", SAMPLES / "training" / "gpt2-lr-high"
    assert invoke("run", "--save", str(tmp_path / "t.safetensors")).exit_code == 0
    commands = {"block": ["run"], "compare": ["compare", "--pre-ln", "--post-ln"], "inspect": ["inspect", str(tiny)],
                "model": ["check", "--weights", str(tiny), "--token-ids", "1", "2"],
                "diff": ["diff", str(tmp_path / "t.safetensors"), str(tmp_path / "t.safetensors")],
                "track": ["track", str(run / "watch.jsonl")]}
    for kind, args in commands.items():
        document = json.loads(invoke(*args, "--json").stdout)
        assert (document["schema"], document["kind"]) == (2, kind), args
    assert "layout" not in json.loads(invoke("inspect", str(tiny), "--json").stdout)
