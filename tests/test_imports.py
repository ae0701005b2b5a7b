"""blocktrace's parts import one way: each package or top-level module imports only parts below it in LAYERS —
read from the `import` statements of every file (function bodies included), no import executed — so no two
parts import each other. A new import that goes up, or closes a loop, fails here naming the file."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from helpers import parsed_source

PACKAGE = Path(__file__).resolve().parents[1] / "blocktrace"

# Lowest first. The pipeline returns results (the report dicts of pipeline/report.py) and render only shows them,
# so render sits above it; training is below the pipeline (`track` checks each checkpoint through
# pipeline/track.py, as every command goes through the pipeline); cli and the entry points on top.
LAYERS = ["_version", "vocab", "phrases", "errors", "wiring", "config", "sizing", "host", "progress", "files", "request",
          "model", "sources", "tracing", "diagnose", "training", "pipeline", "render", "integrations", "cli",
          "__init__", "__main__"]

# What a function body outside cli/ may import, and why there: optional packages (the plot and text extras,
# tensorboard) where they are used, so a missing one is one error line; a platform's module (fcntl: POSIX only);
# torch in sizing.py, which the CLI's options read before --help (kept free of torch: tests/test_startup.py).
LAZY_IMPORTS = {"matplotlib", "matplotlib.pyplot", "tokenizers", "torch.utils.tensorboard", "fcntl",
                ("blocktrace/sizing.py", "torch")}


def _part(module: str) -> str:
    """The package or top-level module of `blocktrace.x.y` (x); the package itself, or a name its __init__
    exports (`from blocktrace import Watch`), is "__init__"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PARTS else "__init__"


PARTS = {path.stem if path.is_file() else path.name for path in PACKAGE.iterdir()
         if path.suffix == ".py" or (path / "__init__.py").is_file()}


def _module_of(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


@functools.lru_cache(maxsize=1)
def imports() -> tuple[tuple[str, str, str], ...]:
    """(importing part, imported part, file) for every blocktrace import between two different parts."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = _part(_module_of(path))
        for node in ast.walk(parsed_source(path)):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "blocktrace":
                names = [f"blocktrace.{alias.name}" for alias in node.names]  # `from blocktrace import pipeline`
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                if name == "blocktrace" or name.startswith("blocktrace."):
                    target = _part(name)
                    if target != source:
                        found.append((source, target, str(path.relative_to(PACKAGE.parent))))
    return tuple(found)


def test_every_part_is_placed():
    parts = {_part(_module_of(path)) for path in PACKAGE.rglob("*.py")}
    assert parts == set(LAYERS)


def test_every_import_goes_down():
    upward = [f"{file}: {source} imports {target}" for source, target, file in imports()
              if LAYERS.index(target) > LAYERS.index(source)]
    assert upward == []


def _function_body_imports():
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(PACKAGE.parent))
        if relative.startswith("blocktrace/cli/"):
            continue  # the CLI imports each command's machinery when that command runs, so --help loads none of it
        for function in ast.walk(parsed_source(path)):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(function):
                    if isinstance(node, ast.Import):
                        yield relative, node.names[0].name
                    elif isinstance(node, ast.ImportFrom):
                        yield relative, node.module


def test_imports_sit_at_the_top_but_for_optional_packages_and_what_keeps_help_light():
    inside = [f"{file}: {module}" for file, module in _function_body_imports()
              if module not in LAZY_IMPORTS and (file, module) not in LAZY_IMPORTS]
    assert inside == []


def test_the_pipeline_does_not_import_render_nor_training_the_pipeline():
    """The two upward imports issue 34 named: the report was built in render/, and track checked through the
    pipeline from training/."""
    pairs = {(source, target) for source, target, _ in imports()}
    assert ("pipeline", "render") not in pairs and ("training", "pipeline") not in pairs


def test_the_two_loops_that_stood_are_gone():
    """request imported a constant from sources (which imports request), files a helper from sources (which
    imports files): both constants now live below both users (vocab, files)."""
    assert LAYERS.index("sources") > LAYERS.index("request")
    assert ("request", "sources") not in {(s, t) for s, t, _ in imports()}
    assert ("files", "sources") not in {(s, t) for s, t, _ in imports()}


def test_test_modules_do_not_import_each_other():
    """So the suite runs under --import-mode=importlib and from any directory."""
    for path in (PACKAGE.parent / "tests").glob("test_*.py"):
        if path.name == Path(__file__).name:
            continue  # this test spells the imports it looks for
        text = path.read_text(encoding="utf-8")
        assert "from conftest" not in text and "import conftest" not in text, path.name
        assert not any(line.lstrip().startswith(("from test_", "import test_")) for line in text.splitlines()), path.name
