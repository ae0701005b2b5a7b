"""What is judged. Importing the package imports every module of checks, so diagnose.checks.CHECKS is whole
wherever it is read."""

from blocktrace.diagnose import audit, dynamics, health, invariants  # noqa: F401  (their @check entries fill CHECKS)
