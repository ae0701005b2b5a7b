"""Re-run every `$ blocktrace ...` example in README.md and docs/*.md and paste its real output under it;
rewrite the table of health checks from the checks themselves.

    python scripts/update_readme_examples.py            # the examples and the table
    python scripts/update_readme_examples.py --tables   # the table of checks only (after adding a check)

tests/test_readme.py fails when a pasted output no longer matches a real run.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = re.compile(r"```console\n\$ (blocktrace [^\n]*)\n.*?```", re.DOTALL)
CHECKS_TABLE = re.compile(r"(<!-- checks:[^\n]*-->\n).*?(\n<!-- /checks -->)", re.DOTALL)


def checks_table() -> str:
    from blocktrace.diagnose.checks import CHECKS

    rows = ["| flag | threshold | source |", "|---|---|---|"]
    rows += [f"| `{c.name}` | {c.threshold.replace('|', chr(92) + '|')} | {c.source} |" for c in CHECKS.values()]
    return "\n".join(rows)


def run_example(command: str) -> str:
    from blocktrace.cli import cli

    args = shlex.split(command)[1:]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    return result.stdout + result.stderr


def main() -> int:
    tables_only = sys.argv[1:] == ["--tables"]

    def paste(match: re.Match) -> str:
        command = match.group(1)
        return f"```console\n$ {command}\n{run_example(command).rstrip()}\n```"

    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        text = CHECKS_TABLE.sub(lambda m: m.group(1) + checks_table() + m.group(2), text)
        page.write_text(text if tables_only else EXAMPLE.sub(paste, text), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
