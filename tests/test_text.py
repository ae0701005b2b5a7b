"""render/text.py: the tables a person reads — CJK tokens and Chinese headings line up by display width, every
heatmap cell lies in its legend's range, escape sequences in tokens never reach the terminal, --lang zh says each
sentence in Chinese."""

import re

import pytest
from helpers import SAMPLES
from wcwidth import wcswidth

from blocktrace.render.text import heatmaps
from blocktrace.vocab import Lang


def grid_tables(text: str) -> list[list[str]]:
    tables, current = [], []
    for line in text.splitlines():
        if line.startswith(("+", "|")):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables + ([current] if current else [])


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_cjk_tokens_and_headings_line_up(invoke, lang):
    text = invoke("run", "--d-model", "4", "--heads", "2", "--tokens", "猫", "吃", "鱼", "--format", "grid",
                  "--lang", lang).stdout
    tables = grid_tables(text)
    assert len(tables) == 3  # the step table and one heatmap per head
    for table in tables:
        assert len({wcswidth(line) for line in table}) == 1, "\n".join(table)


def test_chinese_headings_and_explanations(invoke):
    text = invoke("run", "--d-model", "4", "--heads", "2", "--tokens", "猫 吃 鱼", "--lang", "zh", "--explain").stdout
    assert all(word in text for word in ("步骤", "操作", "输出shape", "加的是原始 x，不是 x_norm1"))
    english = invoke("run", "--explain").stdout
    assert "Adds the original x, not x_norm1" in english


def test_escape_sequences_in_tokens_never_reach_the_terminal(invoke):
    result = invoke("run", "--tokens", "a\x1b[31mred", "猫", "x\u202ey")
    assert result.exit_code == 0
    assert "\x1b" not in result.stdout and "\u202e" not in result.stdout
    assert "tokens: a\\x1b[31mred 猫 x\\u202ey" in result.stdout  # shown, escaped; CJK as it is
    compared = invoke("compare", "--pre-ln", "--post-ln", "--tokens", "a\x1b[2Jb", "c")
    assert "\x1b" not in compared.stdout and "a\\x1b[2Jb" in compared.stdout


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_attention_marks_are_explained_and_each_cell_matches_its_legend(invoke, lang):
    """Every heatmap cell 'w mark' lies in the range the legend line gives that mark (both printed to 2 decimals)."""
    output = invoke("run", "--d-model", "8", "--heads", "2", "--tokens", *"abcdefgh", "--lang", lang).stdout
    legend_line = next(line for line in output.splitlines() if line.startswith(("marks:", "标记：")))
    ranges = {mark: (float(low), float(high)) for mark, low, high in
              re.findall(r"(\S) (\d(?:\.\d+)?)–(\d(?:\.\d+)?)", legend_line)}
    assert len(ranges) == 9
    cells = re.findall(r"(\d\.\d\d) (\S)(?=\s)", output.split(legend_line)[0])  # "0.41 =": 2 decimals, a mark
    assert cells
    for value, mark in cells:
        low, high = ranges[mark]
        assert low - 0.005 <= float(value) <= high + 0.005, (value, mark)


def test_a_printed_weight_always_carries_the_same_mark():
    """Issue 44: marks were taken from the unrounded weight, so a printed 0.20 carried '.' in one cell (0.1996) and
    ':' in the next (0.2004). The mark follows the printed value, whose range the legend gives."""
    report = {"attention": {"weights_first_sequence": [[[0.1996, 0.2004], [0.6996, 0.7004]]], "shape": [1, 2, 2]}}
    text = heatmaps(report, ["a", "b"], Lang.EN, "plain")
    assert text.count("0.20 :") == 2 and text.count("0.70 #") == 2 and "0.20 ." not in text


def test_run_lang_zh_says_its_sentences_in_chinese(invoke):
    """run --lang zh printed its weights line, the inside-attn title and `measured:` in English; the tutorial's own
    variable lines (future_weight_sum=, block_shape_preserved=) stay as the tutorial prints them."""
    args = ["run", "--weights", str(SAMPLES / "llama-tiny"), "--token-ids", "1", "2", "3"]
    english, chinese = invoke(*args).stdout, invoke(*args, "--lang", "zh").stdout
    for word in ("weights: ", "inside attn", "as projected", "measured: "):
        assert word in english and word not in chinese, word
    assert "权重：" in chinese and "实测" in chinese and "future_weight_sum=0.0000" in chinese
