"""The findings' sentences in Chinese (blocktrace/phrases.py, render/phrases_zh.py, render/translate.py): every
template the code says has its Chinese, every sentence made from a template reads back into its values and is said
with that template's Chinese, and sentences joined or nested inside each other are said part by part."""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path

import pytest

from helpers import parsed_source

from blocktrace.phrases import phrase
from blocktrace.render.phrases_zh import CAUSES_ZH, LEVELS_ZH, PHRASES_ZH
from blocktrace.render.translate import chinese, page_words, parse, say
from blocktrace.diagnose.checks import Cause
from blocktrace.vocab import Lang, Level

PACKAGE = Path(__file__).resolve().parents[1] / "blocktrace"
HAN = re.compile(r"[\u4e00-\u9fff]")


def _templates_in_code() -> dict[str, str]:
    """Each template given to `phrase` in blocktrace/, with the file it is in."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(parsed_source(path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "phrase":
                argument = node.args[0]
                assert isinstance(argument, ast.Constant), f"{path}:{node.lineno}: phrase() takes a literal template"
                found[argument.value] = f"{path.name}:{node.lineno}"
    return found


def test_every_template_the_code_says_has_its_chinese_and_every_chinese_its_template():
    in_code = _templates_in_code()
    assert len(in_code) > 100  # the scan reads the checks (a broken scan would pass the rest vacuously)
    missing = {template: where for template, where in in_code.items() if template not in PHRASES_ZH}
    unused = [template for template in PHRASES_ZH if template not in in_code]
    assert missing == {} and unused == []


@pytest.mark.parametrize("template", sorted(PHRASES_ZH))
def test_a_templates_chinese_names_only_its_values_and_says_them_in_chinese(template):
    literals, names, _ = parse(template)
    _, chinese_names, _ = parse(PHRASES_ZH[template])
    assert set(chinese_names) <= set(names)
    assert any(literals)  # a template of values alone would read any text
    assert HAN.search(PHRASES_ZH[template]) or not re.search("[A-Za-z]", "".join(literals))  # words said in Chinese


def _example_values(template: str) -> tuple[dict, dict]:
    """Values for each of the template's names (a number where it has a format), and each as the English shows it."""
    values, shown = {}, {}
    for index, (literal, name, spec, _) in enumerate(string.Formatter().parse(template)):
        if name is None or name in values:
            continue
        # a value right after another is an optional part (a sentence of its own, tested on its own): here, none
        values[name] = "" if index and not literal else (index if spec == "d" else 0.25 + index) if spec else f"v{index}"
        shown[name] = format(values[name], spec) if spec else values[name]
    return values, shown


@pytest.mark.parametrize("template", sorted(PHRASES_ZH))
def test_a_sentence_reads_back_into_its_values_and_is_said_with_its_templates_chinese(template):
    values, shown = _example_values(template)
    english = phrase(template, **values)
    assert chinese(english) == PHRASES_ZH[template].format(**shown)


def test_a_sentence_nested_in_another_is_said_in_chinese_too():
    inputs = phrase("; inputs finite: {finite}", finite=True)
    assert chinese(phrase("{nan} NaN, {inf} Inf{inputs}", nan=3, inf=0, inputs=inputs)) == \
        "3 个 NaN，0 个 Inf；输入是否有限：True"
    assert chinese(phrase("{nan} NaN, {inf} Inf{inputs}", nan=3, inf=0, inputs="")) == "3 个 NaN，0 个 Inf"


def test_a_diagnosis_evidence_of_several_findings_is_said_finding_by_finding():
    """Evidence joins findings with "; ", and a detail in parentheses may hold "; " itself: each stays whole."""
    first = phrase("{name}{where} ({detail})", name="non_finite", where=phrase(" at layer{s} {layers}", s="s",
                                                                               layers="0–2"),
                   detail=phrase("{nan} NaN, {inf} Inf{inputs}", nan=4, inf=1,
                                 inputs=phrase("; inputs finite: {finite}", finite=False)))
    second = phrase("{name}{where} ({detail})", name="attention_logit_growth", where="",
                    detail=phrase("largest pre-softmax logit {logit:.4g}", logit=1.5e4))
    assert chinese(f"{first}; {second}") == ("non_finite，第 0–2 层（4 个 NaN，1 个 Inf；输入是否有限：False）；"
                                              "attention_logit_growth（softmax 前最大的 logit 为 1.5e+04）")


def test_a_list_of_sentences_inside_a_sentence_is_said_item_by_item():
    shown = ", ".join(phrase("shift {shift:d} {loss:.4g}", shift=s, loss=v) for s, v in ((0, 0.05), (1, 2.9)))
    said = chinese(phrase("the model predicts {learned} better than the next token: loss {shown}",
                          learned=phrase("its own input token (shift 0)"), shown=shown))
    assert said == "模型预测它自己的输入 token（偏移 0）比预测下一个 token 更准：损失 偏移 0：0.05，偏移 1：2.9"


def test_english_stays_as_written_and_a_sentence_no_template_made_is_not_said_in_chinese():
    sentence = phrase("largest pre-softmax logit {logit:.4g}", logit=120.0)
    assert say(sentence, Lang.EN) == sentence
    assert chinese("a sentence blocktrace never makes") is None
    assert say("a sentence blocktrace never makes", Lang.ZH) == "a sentence blocktrace never makes"


def test_every_cause_and_level_has_its_chinese_name():
    assert set(CAUSES_ZH) == set(Cause.values()) and set(LEVELS_ZH) == {level.value for level in Level}


def test_a_pages_words_hold_the_chinese_of_every_sentence_of_its_report():
    detail = phrase("largest pre-softmax logit {logit:.4g}", logit=120.0)
    advice = phrase("lower the peak learning rate (a tenth is a first try), keep a warm-up, and clip the gradient "
                    "norm at 1.0")
    report = {"records": [{"flags": [{"name": "attention_logit_growth", "detail": detail, "source": "Wortsman"}],
                           "diagnosis": [{"cause": "learning_rate", "advice": advice}]}], "tokens": ["the cat"]}
    words = page_words(report)
    assert words["sentences"] == {detail: "softmax 前最大的 logit 为 120", advice: PHRASES_ZH[advice]}
    assert words["causes"]["learning_rate"] == "学习率"
