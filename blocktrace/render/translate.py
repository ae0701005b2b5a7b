"""The findings' sentences in the reader's language: an English sentence read back into its template's values
(blocktrace/phrases.py wrote it) and said again with the Chinese template of render/phrases_zh.py.

A sentence is matched, not looked up, because the sentences travel as text — through a timeline on disk, a
`--json` document, a page — and only the text arrives. A template's values are read so that brackets balance in
each (a detail in parentheses stays one value), the template with the most fixed words first; each value is said
again in Chinese where it is a sentence itself. Sentences joined with "; " are said one by one."""

from __future__ import annotations

import functools
import re
import string
from dataclasses import dataclass
from typing import Iterator, Optional

from blocktrace.render.phrases_zh import CAUSES_ZH, LEVELS_ZH, PHRASES_ZH
from blocktrace.vocab import Lang

# Sentences joined into one, and items listed in one value, in each language: tried in this order.
JOINERS = (("; ", "；"), (", ", "，"))
# What a number formatted by a numeric format (g, f, e, d; % for a share) looks like: a value of such a name must be one.
NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?(e[-+]?\d+)?|inf|nan)")
SHARE = re.compile(NUMBER.pattern + "%")
NUMERIC_FORMATS = tuple("gGfFeEd")
BRACKETS = {"(": ")", "[": "]", "（": "）"}
INTERVAL = re.compile(r"\[[^][()]*\)")  # a half-open interval, [0, 1): its brackets do not pair
# The keys of a report (--json) whose values are sentences a reader reads: what a page or an output translates.
SENTENCE_KEYS = ("detail", "evidence", "advice", "loss_note", "how")


@dataclass(frozen=True)
class Template:
    literals: tuple[str, ...]  # the fixed text around the values: one more than the names
    names: tuple[str, ...]
    numbers: tuple[Optional[re.Pattern], ...]  # per name: what its value looks like, where it is formatted as a number
    chinese: str

    @property
    def fixed(self) -> int:
        return sum(map(len, self.literals))


def parse(template: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[Optional[re.Pattern], ...]]:
    """The fixed text, the value names and the look of each value formatted as a number, of a str.format template."""
    literals, names, numbers, current = [], [], [], ""
    for literal, name, spec, _conversion in string.Formatter().parse(template):
        current += literal
        if name is not None:
            literals.append(current)
            names.append(name)
            numbers.append(SHARE if spec.endswith("%") else NUMBER if spec.endswith(NUMERIC_FORMATS) else None)
            current = ""
    return (*literals, current), tuple(names), tuple(numbers)


def balanced(text: str) -> bool:
    """Whether every bracket opened in `text` is closed in it, in order."""
    expected = []
    for character in INTERVAL.sub("", text):
        if character in BRACKETS:
            expected.append(BRACKETS[character])
        elif character in BRACKETS.values() and (not expected or expected.pop() != character):
            return False
    return not expected


def _fits(template: Template, index: int, value: str) -> bool:
    """Whether `value` can be the template's `index`-th value: brackets balanced; a number where the template
    formats one; no sentences joined with ";" unless the template encloses it in brackets (a detail in its
    parentheses) or it is an optional part of its own ("; inputs finite: True"); and where it is written right
    after another value, such an optional part — a sentence of the catalogue — or nothing."""
    number = template.numbers[index]
    if not balanced(value) or (number is not None and not number.fullmatch(value)):
        return False
    before, after = template.literals[index], template.literals[index + 1]
    enclosed = before[-1:] in BRACKETS and after[:1] == BRACKETS[before[-1]]
    if not enclosed and not value.startswith(";") and len(_top_level_parts(value, ";")) > 1:
        return False
    return index == 0 or before != "" or value == "" or chinese(value) is not None


def _ends(template: Template, index: int, text: str, start: int) -> Iterator[int]:
    """Where the `index`-th value may end: before each occurrence of the fixed text after it (anywhere when none)."""
    literal = template.literals[index + 1]
    number = template.numbers[index]
    last = index == len(template.names) - 1
    if number is not None and not literal and not last:  # a number right before another value: all of the number
        found = number.match(text, start)
        if found:
            yield found.end()
        return
    if last:
        if len(text) - len(literal) >= start:
            yield len(text) - len(literal)
        return
    if not literal:
        yield from range(start, len(text) + 1)
        return
    position = text.find(literal, start)
    while position != -1:
        yield position
        position = text.find(literal, position + 1)


def _values(template: Template, text: str, index: int, start: int, found: dict) -> Optional[dict]:
    """The values from the `index`-th on, read from text[start:] (None when the template does not fit)."""
    name, literal = template.names[index], template.literals[index + 1]
    for end in _ends(template, index, text, start):
        value = text[start:end]
        if not _fits(template, index, value):
            continue
        if index == len(template.names) - 1:
            return {**found, name: value}
        read = _values(template, text, index + 1, end + len(literal), {**found, name: value})
        if read is not None:
            return read
    return None


def match(template: Template, text: str) -> Optional[dict]:
    """The template's values in `text`, or None when `text` is not a sentence of this template."""
    if not template.names:
        return {} if text == template.literals[0] else None
    head, tail = template.literals[0], template.literals[-1]
    if len(text) < len(head) + len(tail) or not text.startswith(head) or not text.endswith(tail):
        return None
    return _values(template, text, 0, len(head), {})


@functools.lru_cache(maxsize=1)
def _templates() -> tuple[Template, ...]:
    """The catalogue, the template with the most fixed text first (so a specific sentence wins over a general one)."""
    made = [Template(*parse(english), zh) for english, zh in PHRASES_ZH.items()]
    return tuple(sorted(made, key=lambda t: -t.fixed))


def _top_level_parts(text: str, joiner: str) -> list[str]:
    """`text` split at each `joiner` outside brackets."""
    parts, depth, start, index = [], 0, 0, 0
    while index < len(text):
        if text[index] in BRACKETS:
            depth += 1
        elif text[index] in BRACKETS.values():
            depth -= 1
        elif depth == 0 and text.startswith(joiner, index):
            parts.append(text[start:index])
            start = index + len(joiner)
            index = start
            continue
        index += 1
    return parts + [text[start:]]


@functools.lru_cache(maxsize=4096)
def chinese(text: str) -> Optional[str]:
    """`text` said in Chinese, or None when it is not made of the catalogue's sentences."""
    for template in _templates():
        values = match(template, text)
        if values is not None:
            return template.chinese.format(**{name: chinese(value) or value for name, value in values.items()})
    for english, zh in JOINERS:
        parts = _top_level_parts(text, english)
        said = [chinese(part) for part in parts] if len(parts) > 1 else [None]
        if all(part is not None for part in said):
            return zh.join(said)
    return None


def say(text: str, lang: Lang) -> str:
    """`text` in `lang`: English as written; Chinese where the catalogue says it (else the English, which
    tests/test_translate.py and the zh pages' test forbid for every sentence blocktrace makes)."""
    if Lang(lang) is Lang.EN or not text:
        return text
    return chinese(text) or text


def sentences(report) -> Iterator[str]:
    """Every sentence of a report (the values of SENTENCE_KEYS, wherever they sit in it)."""
    if isinstance(report, dict):
        for key, value in report.items():
            if key in SENTENCE_KEYS and isinstance(value, str):
                yield value
            else:
                yield from sentences(value)
    elif isinstance(report, list):
        for item in report:
            yield from sentences(item)


def page_words(report: dict) -> dict:
    """What a page needs to say the report's sentences in Chinese: each sentence's translation, the causes' and
    the levels' names."""
    said = {text: chinese(text) for text in set(sentences(report))}
    return {"sentences": {text: zh for text, zh in said.items() if zh is not None}, "causes": CAUSES_ZH,
            "levels": LEVELS_ZH}
