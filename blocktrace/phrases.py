"""The sentences a finding, its advice and its notes say, written as templates.

`phrase("max |x| {value:.4g} in a float16 checkpoint", value=x)` is the English sentence, as an f-string would make
it; written through `phrase` its template is a literal that render/phrases_zh.py translates (tests/test_translate.py
fails on a template without its Chinese), and the sentence stays translatable wherever it goes — into a timeline
on disk, back out of one, onto a page — because render/translate.py reads a sentence back into its template's
values. English lives here, at the check that says it; Chinese lives in one catalogue.
"""

from __future__ import annotations


def phrase(template: str, **values) -> str:
    """The English sentence of `template` with `values` filled in (str.format's rules)."""
    return template.format(**values)
