"""What is judged. Importing the package imports both modules of checks, so diagnose.checks.CHECKS is whole
wherever it is read."""

from blocktrace.diagnose import dynamics, health  # noqa: F401  (their @check entries fill CHECKS)
