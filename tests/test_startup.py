"""The entry points, as a shell runs them: `python -m blocktrace`, and help without torch."""

import gc
import subprocess
import sys

import pytest

import blocktrace.cli as package

PROBE = "import sys; sys.argv = ['blocktrace', *{args!r}]\ntry:\n    from blocktrace.cli import main; main()\n" \
        "except SystemExit:\n    pass\nprint('TORCH' if 'torch' in sys.modules else 'NO-TORCH')"


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["inspect", "--help"], ["--version"]])
def test_help_and_version_do_not_import_torch(args):
    output = subprocess.run([sys.executable, "-c", PROBE.format(args=args)], capture_output=True, text=True, check=True)
    assert output.stdout.strip().endswith("NO-TORCH"), output.stdout


def test_python_dash_m_runs_the_cli():
    result = subprocess.run([sys.executable, "-m", "blocktrace", "run", "--d-model", "4", "--heads", "2",
                             "--tokens", "猫", "吃", "鱼"], capture_output=True, text=True)
    assert result.returncode == 0 and "future_weight_sum=0.0000" in result.stdout
    # An error refused at parsing (before torch is imported: the error path through main() costs no second start-up).
    bad = subprocess.run([sys.executable, "-m", "blocktrace", "run", "--heads", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("Error: ") and "Traceback" not in bad.stderr


def test_the_console_script_freezes_what_it_holds_before_the_interpreter_exits(monkeypatch):
    """The interpreter's last garbage collection would traverse every object torch made, to free nothing the exit
    does not free anyway (0.88 s of a 3.90 s `blocktrace run`: benchmarks/bench_startup.py); main() freezes them,
    on an error's exit too. The library's cli() freezes nothing: a caller's process goes on."""
    def fails(**kwargs):
        sys.exit(2)

    monkeypatch.setattr(package, "cli", fails)
    gc.unfreeze()
    try:
        with pytest.raises(SystemExit):
            package.main()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
