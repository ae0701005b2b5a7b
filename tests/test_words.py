"""render/words.py: the words in both languages — every heading and every wiring's sentence for each of its steps
exists in English and in Chinese with the same placeholders, and --explain says each step's own sentence."""

import json
import re
import string

import pytest

from blocktrace.render.words import COMPARE_WORDS, HEADINGS, SENTENCES
from blocktrace.vocab import Lang
from blocktrace.wiring import PARALLEL, PARALLEL_ONE_NORM, WIRINGS


def _fields(text: str) -> set:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


@pytest.mark.parametrize("table", [HEADINGS, COMPARE_WORDS], ids=["headings", "compare"])
def test_every_phrase_is_said_in_both_languages_with_the_same_placeholders(table):
    assert table[Lang.EN].keys() == table[Lang.ZH].keys()
    for key, english in table[Lang.EN].items():
        assert _fields(english) == _fields(table[Lang.ZH][key]), key


@pytest.mark.parametrize("wiring", [*WIRINGS.values(), PARALLEL, PARALLEL_ONE_NORM], ids=lambda w: w.name)
def test_every_wiring_has_a_sentence_for_each_of_its_steps_in_both_languages(wiring):
    for lang in Lang:
        said = SENTENCES[wiring.name][lang]
        assert set(wiring.order) <= said.keys(), (lang, set(wiring.order) - said.keys())
        assert all(said[step].strip() for step in wiring.order)


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("wiring, says", [
    (["--pre-ln"], {"residual1": "x_norm1"}), (["--post-ln"], {"norm1": "x + attn_out"}),
    (["--deepnorm"], {"residual1": "α·x"}),
    # Once: --sandwich --explain was a KeyError traceback (no sentence for post_attn_norm).
    (["--sandwich"], {"post_attn_norm": "attn_out", "residual1": "attn_normed"}),
    (["--reordered"], {"norm1": "attn_out", "residual1": "attn_normed", "ffn": "x1"}),
])
def test_every_wiring_explains_each_of_its_steps(invoke, lang, wiring, says):
    result = invoke("run", "--d-model", "8", "--heads", "2", "--norm", "rmsnorm", *wiring, "--explain", "--lang", lang)
    assert result.exit_code == 0, result.output
    why = [line for line in result.stdout.splitlines() if re.match(r"^\d+ \w+: ", line)]
    steps = [line.split()[1].rstrip(":") for line in why]
    assert steps == [step["name"] for step in json.loads(invoke(
        "run", "--d-model", "8", "--heads", "2", "--norm", "rmsnorm", *wiring, "--json").stdout)["steps"]]
    sentences = {line.split(": ", 1)[0].split()[1]: line.split(": ", 1)[1] for line in why}
    for step, word in says.items():
        assert word in sentences[step], (step, sentences[step])
