"""Comparing a command's output with the output pasted in the docs, to the precision printed.

Not a test module. The text between numbers must be equal (runs of spaces may differ, as a
column widens when a digit does); each number may differ by what its last printed digit can
carry: a float computed with other SIMD instructions rounds 3.25375009 to 3.2537 or 3.2538.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
LAST_DIGITS = 2  # units of the last printed digit a number may move between machines
RELATIVE = 1e-3  # and, for numbers printed with few digits (3 significant), a relative slack


def _slack(text: str, value: float) -> float:
    mantissa = text.split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exponent = int(text.split("e")[1]) if "e" in text else 0
    return LAST_DIGITS * 10.0 ** (exponent - decimals) + RELATIVE * abs(value)


def _close(got: str, expected: str) -> bool:
    if got == expected:
        return True
    a, b = float(got), float(expected)
    return abs(a - b) <= max(_slack(got, a), _slack(expected, b))


def same_output(got: str, expected: str) -> bool:
    if got == expected:
        return True
    words_got, words_expected = NUMBER.split(got), NUMBER.split(expected)
    if len(words_got) != len(words_expected):
        return False
    if any(" ".join(x.split()) != " ".join(y.split()) or (x.strip() == "") != (y.strip() == "")
           for x, y in zip(words_got, words_expected)):
        return False
    return all(_close(x, y) for x, y in zip(NUMBER.findall(got), NUMBER.findall(expected)))
