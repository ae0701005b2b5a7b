"""A command's whole process, start to exit: what a shell user waits for beyond the work itself.

    python benchmarks/bench_startup.py            # 10 interleaved rounds
    python benchmarks/bench_startup.py --rounds 20

Cases, each a fresh process: `python -c "import torch"` (what any command that computes pays to start, and the
exit after it, the interpreter's last garbage collection of torch's objects included), `blocktrace
--help` (imports no torch), the README's first command as the console script runs it (blocktrace.cli:main, which
freezes the process's objects before the interpreter's last garbage collection), and the same command without that
freeze. Writes its section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from common import OWN_SECTIONS, interleaved, machine_facts, write_section

SECTION = OWN_SECTIONS[4]
RUN = ["run", "--d-model", "4", "--heads", "2", "--tokens", "猫", "吃", "鱼"]
UNFROZEN = "from blocktrace.cli import cli; cli(prog_name='blocktrace')"  # main() without its freeze
CASES = {
    "python -c 'import torch' (and its exit)": [sys.executable, "-c", "import torch"],
    "blocktrace --help": [sys.executable, "-m", "blocktrace", "--help"],
    "blocktrace run … (main: frozen before exit)": [sys.executable, "-m", "blocktrace", *RUN],
    "blocktrace run … (cli() alone: not frozen)": [sys.executable, "-c", UNFROZEN, *RUN],
}


def process(command: list[str]):
    return lambda: subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    rounds = parser.parse_args().rounds
    # one warm-up round: the page cache and the compiled files
    medians = interleaved({name: process(command) for name, command in CASES.items()}, rounds, warmup=1)
    facts = machine_facts()
    lines = [SECTION, "",
             f"{facts['date']}, Python {facts['python']}, torch {facts['torch']}, {facts['cpu']}; median of {rounds} "
             "interleaved rounds, each a fresh process (`python benchmarks/bench_startup.py`).", "",
             "| process | seconds |", "|---|---|"]
    lines += [f"| {name} | {value:.2f} |" for name, value in medians.items()]
    frozen, unfrozen = (medians[name] for name in list(CASES)[2:])
    lines += ["", f"Freezing before exit saves {unfrozen - frozen:.2f} s of {unfrozen:.2f} s "
                  f"({(unfrozen - frozen) / unfrozen:.0%}).", ""]
    write_section(SECTION, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
