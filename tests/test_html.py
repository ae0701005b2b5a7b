"""render/html.py and render/page/: `--html FILE` opened in a real browser (Debian's Chromium, driven by Playwright):
each kind of page — a block (`run`), a comparison (`compare`), a checkpoint (`check --weights`) and a run (`track`)
— renders without a console error, shows the numbers of the `--json` document exactly (each cell keeps the JSON
value in data-value), shows a value on hover, links each finding to its place, switches language, fetches nothing,
and is not a blank picture."""

from __future__ import annotations

import io
import json
import re
import shutil

import pytest
from helpers import ROOT, SAMPLES

from blocktrace.render.translate import chinese, sentences

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# CI installs Debian's chromium (.ci/run); a machine without it cannot run these, and says so.
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (Debian: apt-get install "
                                                         "chromium; .ci/run installs it)")
# Chromium as root in a closed network: no sandbox, no background connections (each would be refused).
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
LR_HIGH = SAMPLES / "training" / "gpt2-lr-high"


VIEWPORT = {"width": 1280, "height": 900}


@pytest.fixture(scope="module")
def tab():
    """One tab for the module's pages, each loaded in turn (a new tab per page cost ~0.3 s); with the console errors,
    uncaught exceptions and non-file requests of the page loaded last."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        tab = chromium.new_page(viewport=VIEWPORT)
        tab.errors, tab.requests = [], []
        tab.on("console", lambda message: tab.errors.append(message.text) if message.type == "error" else None)
        tab.on("pageerror", lambda error: tab.errors.append(str(error)))
        tab.on("request", lambda request: None if request.url.startswith("file:") else tab.requests.append(request.url))
        yield tab
        chromium.close()


def _both(invoke, tmp_path, *args):
    """The command's --json document and its --html page, from one run."""
    page = tmp_path / "page.html"
    result = invoke(*args, "--json", "--html", str(page))
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout), page


def _open(tab, path):
    """The page loaded in the tab; every console error and uncaught exception it raised, every request it made."""
    tab.errors.clear()
    tab.requests.clear()
    tab.set_viewport_size(VIEWPORT)
    tab.goto(path.as_uri())
    tab.wait_for_selector("#page > *")
    return tab, tab.errors, tab.requests


def _values(page, selector: str) -> list[float]:
    return [float(v) for v in page.eval_on_selector_all(selector, "cells => cells.map(c => c.dataset.value)")]


def _not_blank(page) -> None:
    """A screenshot with real content: many distinct colours, not one background (the first screen is enough to
    tell, and costs a third of the whole page's picture)."""
    import matplotlib.image

    pixels = matplotlib.image.imread(io.BytesIO(page.screenshot()), format="png")
    colours = {tuple(p) for p in pixels[::7, ::7].reshape(-1, pixels.shape[-1]).tolist()}
    assert len(colours) > 20


def test_a_block_page_shows_every_step_and_each_heads_weights(invoke, tmp_path, tab):
    report, path = _both(invoke, tmp_path, "run", "--d-model", "4", "--heads", "2", "--tokens", "猫", "吃", "鱼")
    page, errors, requests = _open(tab, path)
    assert errors == [] and requests == []
    for step in report["steps"]:
        row = f'table.steps tr[data-step="{step["name"]}"] td[data-name]'
        assert _values(page, row) == [step["stats"][s] for s in ("mean", "std", "min", "max", "rms", "absmax")]
    weights = report["attention"]["weights_first_sequence"]
    for head, matrix in enumerate(weights):
        cells = _values(page, f'figure[data-head="{head}"] rect.cell')
        assert cells == [value for row in matrix for value in row]
    labels = page.eval_on_selector_all('figure[data-head="0"] svg.heatmap text', "ts => ts.map(t => t.textContent)")
    assert labels == ["猫", "吃", "鱼"] * 2  # the tokens on both axes, drawn in the browser's own fonts
    assert float(page.get_attribute("#future-weight-sum", "data-value")) == report["attention"]["future_weight_sum"]
    # the heatmaps' colour scale (issue 44: they had none): its ticks, and a cell's colour is the scale's at its value
    ticks = page.eval_on_selector_all("svg.colour-scale text.scale-tick", "ts => ts.map(t => Number(t.dataset.value))")
    assert ticks == [0, 0.25, 0.5, 0.75, 1]
    shade = round(255 * (1 - min(1, max(0, weights[0][0][0]))))
    assert page.get_attribute('figure[data-head="0"] rect.cell[data-query="0"][data-key="0"]', "fill") == \
        f"rgb({shade},{shade},255)"
    cell = page.locator('figure[data-head="1"] rect.cell[data-query="2"][data-key="0"]')
    cell.hover()
    assert page.is_visible("#tip") and str(weights[1][2][0]) in page.inner_text("#tip")
    assert page.locator(".flow .box").count() == 1 + len(report["steps"])  # x, then each step
    _not_blank(page)


def test_a_block_pages_step_table_is_the_terminals_with_its_input_row(invoke, tmp_path, tab):
    """Issue 44: the page dropped the terminal's row 0 (the input x) and printed -1.987e-8 where the terminal (and the
    tutorial) print -0.0000: the table's cells now read as the terminal's, 4 decimals, the exact value on hover."""
    report, path = _both(invoke, tmp_path, "run", "--d-model", "4", "--heads", "2", "--tokens", "猫", "吃", "鱼")
    page, errors, _ = _open(tab, path)
    assert errors == []
    rows = page.eval_on_selector_all("table.steps tbody tr", "rs => rs.map(r => r.dataset.step)")
    assert rows == ["x", *[step["name"] for step in report["steps"]]]
    for entry in [report["input"], *report["steps"]]:
        cells = f'table.steps tr[data-step="{entry["name"]}"] td[data-name]'
        texts = page.eval_on_selector_all(cells, "cs => cs.map(c => c.textContent)")
        assert texts == [format(entry["stats"][s], ".4f") for s in ("mean", "std", "min", "max", "rms", "absmax")]


def test_the_rms_chart_has_an_axis_and_each_bars_value(invoke, tmp_path, tab):
    """Issue 44: the rms chart had no axis or values. Each bar carries its value above it, the axis runs from 0 to the
    largest, both ticks labelled."""
    report, path = _both(invoke, tmp_path, "run", "--d-model", "4", "--heads", "2", "--tokens", "猫", "吃", "鱼")
    page, errors, _ = _open(tab, path)
    chart = 'svg[aria-label="rms"]'
    rms = [step["stats"]["rms"] for step in report["steps"]]
    written = page.eval_on_selector_all(f"{chart} text.bar-value", "ts => ts.map(t => [t.dataset.value, t.textContent])")
    assert [float(value) for value, _ in written] == rms
    assert [float(text) for _, text in written] == pytest.approx(rms, abs=5e-5)  # shown to 4 decimals
    ticks = page.eval_on_selector_all(f"{chart} text.tick", "ts => ts.map(t => Number(t.dataset.value))")
    assert errors == [] and ticks == [0, max(rms)] and page.locator(f"{chart} line.axis").count() == 2


def _has_cjk_font() -> bool:
    import subprocess

    try:
        return bool(subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True).stdout.strip())
    except OSError:
        return False


def test_a_page_with_chinese_says_when_the_browser_has_no_font_for_it(invoke, tmp_path, tab):
    """Issue 44: without a CJK font every Chinese glyph was a box, without a word. Every page carries the glyphs of
    blocktrace's own words (and the tutorials' tokens); where a token's character is not among them, the page
    measures whether its browser draws it as a missing glyph and says so (in English, which such a browser can
    draw). Which side this machine is on follows fontconfig."""
    _, covered = _both(invoke, tmp_path, "run", "--d-model", "4", "--heads", "2", "--tokens", "猫", "吃", "鱼")
    page, errors, _ = _open(tab, covered)
    assert errors == [] and page.locator("p.font-note").count() == 0  # every character is in the page's font
    (tmp_path / "page.html").unlink()
    _, uncovered = _both(invoke, tmp_path, "run", "--d-model", "4", "--heads", "2", "--tokens", "龘", "吃")
    page, errors, _ = _open(tab, uncovered)
    assert errors == [] and (page.locator("p.font-note").count() == 1) is not _has_cjk_font()
    if not _has_cjk_font():
        assert "some Chinese characters of the tokens" in page.inner_text("p.font-note")
    (tmp_path / "page.html").unlink()
    _, latin = _both(invoke, tmp_path, "run", "--d-model", "4", "--heads", "2", "--tokens", "cat", "eats", "fish")
    page, _, _ = _open(tab, latin)
    page.click("#language")  # an English page switched to Chinese draws it with the glyphs it carries
    assert page.locator("p.font-note").count() == 0 and "Noto Sans CJK SC" in _fonts_drawing(page, "header h1")


def test_a_chinese_page_carries_a_glyph_for_every_chinese_character_it_shows(invoke, tmp_path, tab):
    """The page's font (render/page/cjk.woff, read here with fontTools) holds every Chinese character a zh page of
    each kind shows, the browser loads it, and draws the page's Chinese with it (or with a CJK font of its own)."""
    from fontTools.ttLib import TTFont

    from blocktrace.render.html import CJK_FONT, cjk_characters

    glyphs = {chr(code) for code in TTFont(CJK_FONT).getBestCmap()}
    for command in (["track", str(LR_HIGH / "watch.jsonl")], ["compare", "--pre-ln", "--post-ln"],
                    ["run", "--d-model", "4", "--heads", "2", "--tokens", "猫", "吃", "鱼", "--explain"]):
        path = tmp_path / f"{command[0]}.html"
        assert invoke(*command[:-1] if command[-1] == "--explain" else command, "--lang", "zh", "--html",
                      str(path)).exit_code in (0, 1)
        page, errors, _ = _open(tab, path)
        page.eval_on_selector_all("details", "all => all.forEach((d) => { d.open = true; })")
        shown = cjk_characters(page.inner_text("body"))
        # loaded on demand (a browser with a CJK font of its own needs it not): asked for, it decodes
        loaded = page.evaluate("""async () => (await document.fonts.load('16px "blocktrace CJK"', '猫'))
                               .map((f) => f.status)""")
        assert errors == [] and shown and shown <= glyphs and loaded == ["loaded"]
        assert "Noto Sans CJK SC" in _fonts_drawing(page, "header h1")  # the face drew it (or a system one)


def _fonts_drawing(page, selector: str) -> set[str]:
    """The fonts the browser drew an element's text with (Chromium's own account, over its DevTools protocol)."""
    session = page.context.new_cdp_session(page)
    session.send("DOM.enable")
    session.send("CSS.enable")
    root = session.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
    node = session.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    return {font["familyName"] for font in session.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]}


def test_the_pages_font_covers_every_chinese_character_of_blocktraces_own_words():
    """A sentence with a new character fails here until scripts/make_page_font.py makes the font again."""
    from fontTools.ttLib import TTFont

    from blocktrace.render.html import CJK_COVERED, CJK_FONT, cjk_characters, own_chinese

    glyphs = {chr(code) for code in TTFont(CJK_FONT).getBestCmap()}
    assert cjk_characters(own_chinese()) <= set(CJK_COVERED.read_text(encoding="utf-8")) <= glyphs


@pytest.mark.parametrize("wiring, skips", [
    ("--pre-ln", [("x", "residual1"), ("residual1", "residual2")]),  # the stream bypasses both norms
    ("--post-ln", [("x", "residual1"), ("norm1", "residual2")]),  # it leaves from the norm after each sum
    ("--sandwich", [("x", "residual1"), ("residual1", "residual2")]),
    (str(SAMPLES / "neox-tiny"), [("x", "residual1"), ("x", "norm2"), ("residual1", "residual2")]),  # parallel
])
def test_the_flow_draws_the_residual_stream_where_the_wiring_puts_it(invoke, tmp_path, tab, wiring, skips):
    """Issue 44: the flow strip was a plain chain, so Pre-LN and Post-LN looked alike. Each sum's stream operand is
    drawn as an arc from the box that made it to its ⊕, read from the steps' operations (x1 = x + attn_out)."""
    given = ["--weights", wiring, "--token-ids", "1", "2"] if "/" in wiring else \
        ["--d-model", "4", "--heads", "2", "--tokens", "a", "b", wiring]
    report, path = _both(invoke, tmp_path, "run", *given)
    page, errors, _ = _open(tab, path)
    drawn = page.eval_on_selector_all(".flow path.skip", "ps => ps.map(p => [p.dataset.from, p.dataset.to])")
    assert errors == [] and [tuple(arc) for arc in drawn] == skips


@pytest.mark.parametrize("lang, heading", [("en", "what each step does:"), ("zh", None)])
def test_a_block_page_says_what_each_step_does_as_explain_does(invoke, tmp_path, tab, lang, heading):
    """Issue 44: --explain's sentences, the best learner material in the tool, never reached the page."""
    args = ["run", "--d-model", "4", "--heads", "2", "--tokens", "a", "b", "--post-ln", "--lang", lang]
    terminal = invoke(*args, "--explain").stdout.splitlines()
    start = next(i for i, line in enumerate(terminal) if line.startswith("1 ")) if heading is None else \
        terminal.index(heading) + 1
    said = dict(re.match(r"\d+ (\w+): (.*)", line).groups() for line in terminal[start:start + 6])
    _, path = _both(invoke, tmp_path, *args)
    page, errors, _ = _open(tab, path)
    shown = page.eval_on_selector_all("details.explain dd", "ds => ds.map(d => [d.dataset.step, d.textContent])")
    assert errors == [] and dict(shown) == said


def test_the_page_switches_to_chinese_and_back(invoke, tmp_path, tab):
    _, path = _both(invoke, tmp_path, "run", "--d-model", "4", "--heads", "2", "--tokens", "猫", "吃", "鱼",
                    "--lang", "zh")
    page, errors, _ = _open(tab, path)
    assert "逐步展开" in page.inner_text("header h1") and page.get_attribute("html", "lang") == "zh"
    page.click("#language")
    assert "step by step" in page.inner_text("header h1") and errors == []


@pytest.mark.parametrize("command", [["check", "--weights", str(LR_HIGH / "step_0010"), "--token-ids", "1", "2", "3"],
                                     ["track", str(LR_HIGH / "watch.jsonl")]])
def test_check_and_track_pages_start_in_the_language_asked(invoke, tmp_path, tab, command):
    """check and track print English findings; --lang zh sets the language their page starts in."""
    path = tmp_path / "page.html"
    assert invoke(*command, "--lang", "zh", "--html", str(path)).exit_code in (0, 1)
    page, errors, _ = _open(tab, path)
    assert page.get_attribute("html", "lang") == "zh" and errors == []
    assert page.inner_text("#language") == "English"  # the button offers the other language


# Three English words in a row: a sentence left untranslated (code, names and formulas are single words or symbols).
ENGLISH_WORDS = re.compile(r"[A-Za-z]{2,}(?:[ ,'’-]+[A-Za-z]{2,}){2,}")
COMMAND = re.compile(r"blocktrace [a-z]+( [A-Z]+| --[a-z-]+)+")  # a command the Chinese advice quotes as typed


@pytest.mark.parametrize("command, said", [
    (["check", "--weights", str(LR_HIGH / "step_0010"), "--token-ids", *map(str, range(1, 9))], "建议"),
    (["track", str(LR_HIGH / "watch.jsonl")], "最早的问题迹象"),
    (["run", "--d-model", "4", "--heads", "2", "--tokens", "猫", "吃", "鱼"], "每一步做什么"),
    (["compare", "--pre-ln", "--post-ln"], "连线方式之间的差异")])
def test_a_chinese_page_says_no_sentence_in_english(invoke, tmp_path, tab, command, said):
    """Every finding's detail, each cause's evidence and advice, the levels and causes: Chinese on a zh page, each
    sentence of the report translated (the note for a browser without a CJK font stays English: it must be read
    where Chinese cannot be)."""
    report, path = _both(invoke, tmp_path, *command, "--lang", "zh")
    assert all(chinese(sentence) is not None for sentence in sentences(report))
    page, errors, _ = _open(tab, path)
    page.eval_on_selector_all("details", "all => all.forEach((d) => { d.open = true; })")
    page.wait_for_timeout(100)  # closed layers draw their contents when opened
    text = page.evaluate("() => { document.querySelectorAll('.font-note').forEach((n) => n.remove()); "
                         "return document.body.innerText; }")
    assert errors == [] and said in text
    assert ENGLISH_WORDS.findall(COMMAND.sub("", text)) == []


def test_a_checkpoint_page_links_each_finding_to_its_layer_and_step(invoke, tmp_path, tab):
    report, path = _both(invoke, tmp_path, "check", "--weights", str(LR_HIGH / "step_0010"), "--text-file",
                         str(SAMPLES / "training" / "eval.txt"))
    page, errors, requests = _open(tab, path)
    assert errors == [] and requests == []
    assert _values(page, 'table.layers td[data-name="rms"]') == [layer["rms"] for layer in report["layers"]]
    assert float(page.get_attribute("#loss", "data-value")) == report["loss"]
    located = [flag for flag in report["flags"] if flag["layer"] is not None]
    assert located
    for flag in located:
        link = page.locator(f'.finding[data-flag="{flag["name"]}"] a').first.get_attribute("href")
        assert page.locator(link).count() == 1, link  # the target row exists
    _not_blank(page)


def test_a_layers_many_flags_wrap_within_the_page(invoke, tmp_path, tab):
    """Issue 44: one layer's flags overflowed the check table past the page's edge. They wrap in their cell."""
    report, path = _both(invoke, tmp_path, "check", "--weights", str(LR_HIGH / "step_0100"), "--text-file",
                         str(SAMPLES / "training" / "eval.txt"))
    assert any(len(", ".join(step.get("flags") or [])) > 60 for layer in report["layers"] for step in layer["steps"])
    page, errors, _ = _open(tab, path)
    page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
    right = page.evaluate("Math.max(...[...document.querySelectorAll('table.steps')]"
                          ".map(t => t.getBoundingClientRect().right))")
    assert errors == [] and right <= page.evaluate("document.documentElement.clientWidth")


def test_a_comparison_page_shows_both_wirings_and_their_differences(invoke, tmp_path, tab):
    report, path = _both(invoke, tmp_path, "compare", "--pre-ln", "--post-ln")
    page, errors, _ = _open(tab, path)
    assert errors == []
    for variant in report["variants"]:
        for step in variant["report"]["steps"]:
            row = f'section[data-variant="{variant["value"]}"] tr[data-step="{step["name"]}"] td[data-name="rms"]'
            assert _values(page, row) == [step["stats"]["rms"]]
    output = report["differences"]["output"]
    assert _values(page, 'tr[data-step="output"] td[data-name]') == [output["max_abs_diff"], output["cosine"]]
    # named as the docs and the flags name them (issue 44: the page said "pre" and "post")
    headings = page.eval_on_selector_all("section[data-variant] h2", "hs => hs.map(h => h.textContent)")
    assert headings == ["Pre-LN", "Post-LN"]


def test_a_depth_comparison_page_draws_both_stacks_layer_by_layer(invoke, tmp_path, tab):
    """Issue 44: compare --layers N --html drew two empty step tables. It draws the stream's ‖x‖²/d over depth for
    both wirings, each one's per-layer table (‖x‖²/d, branch shares, defined on the page), the gradient each layer's
    FFN receives (--grad) and the layers' differences — every number the --json document's."""
    report, path = _both(invoke, tmp_path, "compare", "--pre-ln", "--post-ln", "--layers", "4", "--grad")
    page, errors, _ = _open(tab, path)
    assert errors == []
    for variant in report["variants"]:
        layers, name = variant["report"]["layers"], {"pre": "Pre-LN", "post": "Post-LN"}[variant["value"]]
        for column in ("rms", "sq_norm_per_d", "attn_share", "ffn_share"):
            cells = f'section[data-variant="{variant["value"]}"] table.layers td[data-name="{column}"]'
            assert _values(page, cells) == [layer[column] for layer in layers], column
        drawn = _values(page, f'svg[aria-label="‖x‖²/d"] circle[data-series="{name}"]')
        assert drawn == [layer["sq_norm_per_d"] for layer in layers]
        grads = _values(page, f'svg[aria-label="‖∂L/∂W_ffn2‖"] circle[data-series="{name}"]')
        assert grads == [g["weight_grad_norms"]["ffn_w2"] for g in variant["report"]["gradients"]["layers"]]
    differences = report["differences"]["layers"]
    assert _values(page, 'table.depth-differences td[data-name="cosine"]') == [d["cosine"] for d in differences]
    assert "attn_share and ffn_share: the variance of the sublayer's update" in page.inner_text("main")


def test_a_stack_page_shows_each_layers_numbers(invoke, tmp_path, tab):
    report, path = _both(invoke, tmp_path, "run", "--layers", "3", "--d-model", "8", "--heads", "2", "--tokens",
                         "a", "b", "c")
    assert report["kind"] == "stack"
    page, errors, _ = _open(tab, path)
    assert errors == []
    for column in ("rms", "sq_norm_per_d", "attn_share", "ffn_share"):
        assert _values(page, f'table.layers td[data-name="{column}"]') == [layer[column] for layer in report["layers"]]
    for layer in report["layers"]:
        for step in layer["steps"]:
            cells = f'#L{layer["layer"]}-step-{step["name"]} td[data-name="rms"]'
            assert _values(page, cells) == [step["stats"]["rms"]]


def test_a_depth_sweep_comparison_page_draws_the_gradient_at_each_depth(invoke, tmp_path, tab):
    report, path = _both(invoke, tmp_path, "compare", "--pre-ln", "--post-ln", "--layers", "2,4", "--grad")
    page, errors, _ = _open(tab, path)
    assert errors == []
    for variant in report["variants"]:
        sweep, name = variant["report"]["sweep"], {"pre": "Pre-LN", "post": "Post-LN"}[variant["value"]]
        assert _values(page, f'svg[aria-label="‖∂L/∂W_ffn2‖"] circle[data-series="{name}"]') == \
            [row["last_layer"]["ffn_w2"] for row in sweep]
        cells = f'section[data-variant="{variant["value"]}"] table.sweep td[data-name="loss"]'
        assert _values(page, cells) == [row["loss"] for row in sweep]


def test_a_run_against_a_healthy_one_draws_both_and_where_they_part(invoke, tmp_path, tab):
    """Issue 44: track --against --html left the comparison out (it was in the page's JSON, never drawn)."""
    twins = SAMPLES / "training"
    report, path = _both(invoke, tmp_path, "track", str(twins / "gpt2-twin-detached" / "watch.jsonl"), "--against",
                         str(twins / "gpt2-twin-healthy" / "watch.jsonl"))
    against = report["against"]
    page, errors, _ = _open(tab, path)
    assert errors == []
    assert _values(page, 'svg[aria-label="loss, both runs"] circle[data-series="this run"]') == \
        [s["loss"] for s in against["steps"]]
    assert _values(page, 'svg[aria-label="loss, both runs"] circle[data-series="the healthy run (--against)"]') == \
        [s["reference_loss"] for s in against["steps"]]
    assert _values(page, 'table.against td[data-name="reference_loss"]') == [s["reference_loss"] for s in against["steps"]]
    first = against["first_parted"]
    assert page.locator('line[data-mark="parted"]').count() == 1
    assert f"step {first['step']}" in page.inner_text("#first-parted") and first["quantity"] in page.inner_text("#first-parted")


def test_a_run_page_draws_the_training_logs_numbers(invoke, tmp_path, tab):
    """Issue 44: track --log's columns (the log's loss, learning rate, gradient norm) reached the terminal only."""
    report, path = _both(invoke, tmp_path, "track", str(LR_HIGH / "step_*"), "--text-file",
                         str(SAMPLES / "training" / "eval.txt"), "--log", str(LR_HIGH / "log.jsonl"))
    page, errors, _ = _open(tab, path)
    logged = [r for r in report["records"] if r.get("log")]
    assert errors == [] and logged
    assert _values(page, "circle[data-series=\"the training log's loss (--log)\"]") == [r["log"]["loss"] for r in logged]
    assert _values(page, 'svg[aria-label="lr"] circle') == [r["log"]["lr"] for r in logged]


def test_a_run_page_draws_the_timeline_with_its_findings_and_first_sign(invoke, tmp_path, tab):
    report, path = _both(invoke, tmp_path, "track", str(LR_HIGH / "watch.jsonl"))
    page, errors, requests = _open(tab, path)
    assert errors == [] and requests == []
    losses = [record["loss"] for record in report["records"]]
    assert _values(page, 'circle[data-series="loss"]') == losses
    first = report["first_sign"]
    assert page.locator('line[data-mark="first"]').count() == 3  # on each chart: loss, rms, update sizes
    # each chart's legend says what its marker lines mean (issue 44: they had no legend)
    assert page.locator('.legend span[data-mark="first"]').count() == 3
    assert page.locator('.legend span[data-mark="first"]').first.inner_text() == "the first sign of trouble"
    assert page.locator('.legend span[data-mark="new"]').first.inner_text() == "a record with new findings"
    ticks = page.eval_on_selector_all('svg[aria-label="rms"] text.step-tick', "ts => ts.map(t => t.textContent)")
    assert ticks == [str(step) for step in (r["step"] for r in report["records"])]  # step 0 too (it went unlabelled)
    assert f"{first['step']}" in page.inner_text("#first-sign") and first["name"] in page.inner_text("#first-sign")
    updates = [max((w["update_ratio"] for w in (record["layers"][0].get("weights") or {}).values()
                    if w.get("update_ratio") is not None), default=None) for record in report["records"]]
    drawn = page.eval_on_selector_all('svg[aria-label="‖ΔW‖/‖W‖"] circle[data-series="L0"]',
                                      "cs => cs.map(c => [Number(c.dataset.step), Number(c.dataset.value)])")
    assert drawn == [[r["step"], u] for r, u in zip(report["records"], updates) if u]  # layer 0's largest update
    page.locator('circle[data-series="loss"]').nth(1).hover()
    assert str(losses[1]) in page.inner_text("#tip")
    _not_blank(page)


def test_the_page_is_one_file_that_fetches_nothing(invoke, tmp_path):
    _, path = _both(invoke, tmp_path, "run", "--d-model", "4", "--heads", "2", "--tokens", "a", "</script>", "b")
    text = path.read_text(encoding="utf-8")
    # no stylesheet, script or image from elsewhere, and no request made by the script (the browser tests above
    # also see no request leave the file); the one URL in it is the SVG namespace, a name and not an address
    assert not any(word in text for word in ("<link", " src=", "fetch(", "XMLHttpRequest", "https://", "import("))
    # each of the page's scripts (the document, the data beside it, the code) is closed once: the token "</script>"
    # is escaped inside the embedded JSON
    assert text.count("</script>") == text.count("<script") == 5


def _small_timeline(path, count: int):
    from blocktrace.training.timeline import dumps, record

    path.write_text("".join(dumps(record(10 * k, "watch", [], [], [], loss=3.0, lr=1e-3)) + "\n"
                            for k in range(count)), encoding="utf-8")
    return path


def test_a_long_runs_page_says_it_shows_a_selection_of_the_records(invoke, tmp_path, tab, monkeypatch):
    """Issue 45.7: a thinned report (training/thinning.py) says so on its page, as in --json and the text."""
    from blocktrace.training import thinning

    timeline = _small_timeline(tmp_path / "run.jsonl", 40)
    monkeypatch.setattr(thinning, "TRACK_POINTS", 4)
    report, path = _both(invoke, tmp_path, "track", str(timeline))
    page, errors, _ = _open(tab, path)
    assert errors == []
    said = page.inner_text("#thinning")
    assert f"{report['thinning']['records_kept']} / 40" in said and "every record" in said
    assert page.locator('circle[data-series="loss"]').count() == len(report["records"]) < 40
    page.click("#language")  # the same note in Chinese, its selection said too
    said = page.inner_text("#thinning")
    every = re.match(r"one record in (\d+) ", report["thinning"]["how"]).group(1)
    assert f"每 {every} 条记录取一条" in said and ENGLISH_WORDS.findall(said) == []


def test_a_short_runs_page_says_nothing_of_a_selection(invoke, tmp_path, tab):
    _, path = _both(invoke, tmp_path, "track", str(_small_timeline(tmp_path / "run.jsonl", 40)))
    page, errors, _ = _open(tab, path)
    assert errors == [] and page.locator("#thinning").count() == 0


HOSTILE_TOKENS = ["<!--", "<script>", "</script>", "x-->", "&amp;", "]]>"]


def test_no_string_in_the_document_can_end_or_break_the_pages_script(invoke, tmp_path, tab):
    """Issue 45.1: "<!--" in a token blanked the page (it was written "<\\!--", which is not JSON). Every token the
    HTML parser treats specially inside a <script> element reaches the page's document as it was given."""
    report, path = _both(invoke, tmp_path, "run", "--d-model", "4", "--heads", "2", "--tokens", *HOSTILE_TOKENS)
    text = path.read_text(encoding="utf-8")
    embedded = text.split('<script type="application/json" id="report">', 1)[1].split("</script>", 1)[0]
    assert "<" not in embedded and json.loads(embedded) == report  # the same document, nothing for the parser
    page, errors, _ = _open(tab, path)
    assert errors == []
    assert page.evaluate("JSON.parse(document.getElementById('report').textContent)") == report
    labels = page.eval_on_selector_all('figure[data-head="0"] svg.heatmap text', "ts => ts.map(t => t.textContent)")
    assert labels == HOSTILE_TOKENS * 2


def test_a_long_inputs_page_draws_each_heads_attention_map(invoke, tmp_path, tab):
    """Past 16 tokens the page draws the --json document's attention map (each cell the largest weight of its block
    of query-key pairs), says what a cell is, and shows a cell's value and its token ranges on hover."""
    words = [f"w{i}" for i in range(100)]
    report, path = _both(invoke, tmp_path, "run", "--d-model", "8", "--heads", "2", "--tokens", *words)
    pooled = report["attention"]["weights_map"]
    assert report["attention"]["weights_first_sequence"] is None and pooled["cell"] == 3
    page, errors, requests = _open(tab, path)
    assert errors == [] and requests == []
    for head, matrix in enumerate(pooled["heads"]):
        assert _values(page, f'figure[data-head="{head}"] rect.cell') == [v for row in matrix for v in row]
    assert "the largest weight among the 3 × 3 query–key pairs" in page.inner_text("main")
    assert "shaded by √weight" in page.inner_text("figure.scale figcaption")  # the map's own colour scale
    page.locator('figure[data-head="1"] rect.cell[data-query="10"][data-key="4"]').hover()
    assert page.inner_text("#tip") == f"q 30–32 → k 12–14: largest weight {pooled['heads'][1][10][4]}"
    _not_blank(page)


@pytest.mark.parametrize("lang, said, unsaid", [("en", "each cell is one query–key weight", "too many"),
                                                 ("zh", "每个格子是一个 query–key 权重", "无法逐个显示")])
def test_a_map_of_one_pair_per_cell_says_so(invoke, tmp_path, tab, lang, said, unsaid):
    """Issue 44: a 32-token page said each cell covers "1 × 1 query–key pairs … too many to show one by one"."""
    report, path = _both(invoke, tmp_path, "run", "--d-model", "8", "--heads", "2", "--tokens",
                         *[f"w{i}" for i in range(32)], "--lang", lang)
    assert report["attention"]["weights_map"]["cell"] == 1
    page, errors, _ = _open(tab, path)
    text = page.inner_text("main")
    assert errors == [] and said in text and unsaid not in text and "1 × 1" not in text


def test_a_checkpoints_layers_draw_their_maps_when_opened(invoke, tmp_path, tab):
    """A checkpoint's page keeps each layer's attention closed, and draws its maps when the reader opens it."""
    ids = [str(i % 50 + 1) for i in range(40)]
    report, path = _both(invoke, tmp_path, "check", "--weights", str(LR_HIGH / "step_0010"), "--token-ids", *ids)
    page, errors, _ = _open(tab, path)
    assert page.locator("rect.cell").count() == 0  # nothing drawn before it is opened
    page.locator("#L1 + .flow + table + details summary").click()
    page.wait_for_selector('figure[data-head="0"] rect.cell')  # drawn by the toggle event, after the click returns
    matrix = report["layers"][1]["attention"]["weights_map"]["heads"][0]
    assert _values(page, 'figure[data-head="0"] rect.cell') == [v for row in matrix for v in row] and errors == []


CARRIED_FONT = 120_000  # render/page/cjk.woff (about 87 KB) in base64


def test_a_gpt2_small_layers_page_at_1024_tokens_stays_small(invoke, tmp_path):
    """The page's size is the attention map's (heads × at most 48 × 48 cells) and the tokens', whatever the width:
    GPT-2 small's 12 heads at T = 1,024 (a narrow block: d_model changes no cell)."""
    path = tmp_path / "page.html"
    result = invoke("run", "--d-model", "48", "--heads", "12", "--tokens", *map(str, range(1024)), "--html", str(path))
    assert result.exit_code in (0, 1), result.output
    assert path.stat().st_size < 300_000 + CARRIED_FONT  # and the Chinese glyphs every page carries


SCREENSHOT = ROOT / "docs" / "block-page.png"
SCREENSHOT_SIZE = {"width": 1100, "height": 760}


def test_the_readmes_screenshot_is_the_page_of_its_html_command(invoke, tmp_path, tab):
    """The README shows its --html command's page: this test takes that screenshot in the suite's browser (written to
    docs/ with BLOCKTRACE_UPDATE_SCREENSHOT=1); otherwise it checks the committed one is a picture of that size, shown
    by the README under that command, and that a fresh one is not blank."""
    import os

    import matplotlib.image

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = next(line for line in readme.splitlines() if line.startswith("blocktrace run") and "--html" in line)
    args = command.split()[1:]
    args[args.index("--html") + 1] = str(tmp_path / "block.html")
    assert invoke(*args).exit_code == 0
    page, errors, _ = _open(tab, tmp_path / "block.html")
    page.set_viewport_size(SCREENSHOT_SIZE)
    shot = page.screenshot()
    assert errors == [] and len({tuple(p) for p in matplotlib.image.imread(io.BytesIO(shot), format="png")
                                 .reshape(-1, 4)[::11].tolist()}) > 20
    if os.environ.get("BLOCKTRACE_UPDATE_SCREENSHOT") == "1":
        SCREENSHOT.write_bytes(shot)
    committed = matplotlib.image.imread(str(SCREENSHOT))
    assert committed.shape[:2] == (SCREENSHOT_SIZE["height"], SCREENSHOT_SIZE["width"])
    assert "(docs/block-page.png)" in readme.split(command, 1)[1].split("## ", 1)[0]


def test_a_layer_whose_block_differs_from_the_models_says_how(invoke, tmp_path, tab):
    """Gemma-2's first layer attends through a window its second does not: the page says so under that layer, as
    the document's config_differences do, and says nothing under the other."""
    report, path = _both(invoke, tmp_path, "check", "--weights", str(SAMPLES / "gemma2-tiny"), "--token-ids", "1", "2")
    page, errors, _ = _open(tab, path)
    differs = [layer["config_differences"] for layer in report["layers"]]
    assert differs[0] and not differs[1] and errors == []
    assert page.locator("#L0 + p.differs").inner_text().endswith(
        " ".join(f"{key}={json.dumps(value)}" for key, value in differs[0].items()))
    assert page.locator("#L1 + p.differs").count() == 0


def test_the_page_says_the_blocks_settings_as_the_document_holds_them(invoke, tmp_path, tab):
    report, path = _both(invoke, tmp_path, "run", "--d-model", "4", "--heads", "2", "--norm", "rmsnorm", "--tokens", "a", "b")
    page, errors, _ = _open(tab, path)
    page.click("details.settings > summary")
    page.click("details.all-settings > summary")
    said = page.inner_text("details.settings p.all").split()
    config = report["config"]
    assert errors == [] and {"d_model=4", "n_heads=2", "norm=rmsnorm", f"d_ff={config['d_ff']}"} <= set(said)
    assert len(said) == sum(value is not None for value in config.values())


def test_the_settings_first_say_what_differs_from_blocktraces_own_block(invoke, tmp_path, tab):
    """Issue 44: a plain GPT-2 block's page listed ~35 internal fields. First come the settings that differ from
    BlockConfig's defaults at the block's size, the rest behind a toggle."""
    from blocktrace.config import BlockConfig

    report, path = _both(invoke, tmp_path, "run", "--weights", str(SAMPLES / "gpt2-tiny"), "--token-ids", "1", "2")
    config = report["config"]
    defaults = BlockConfig(d_model=config["d_model"], n_heads=config["n_heads"]).to_dict()
    expected = [f"{key}={value}" for key, value in config.items() if value != defaults.get(key)]
    page, errors, _ = _open(tab, path)
    page.click("details.settings > summary")
    shown = page.inner_text("details.settings p.not-default").split(": ", 1)[1].split()
    assert errors == [] and shown == expected and 0 < len(shown) < 8
    assert not page.is_visible("details.settings p.all")  # the other settings wait behind their toggle


def test_a_trace_shown_in_a_notebook_draws_its_page_inside_its_frame(tmp_path, tab):
    """What a notebook shows for a Trace (render/notebook.py): the page, drawn inside a sandboxed iframe."""
    import torch

    import blocktrace
    from blocktrace.render.notebook import trace_frame, trace_report

    block = blocktrace.build_block(blocktrace.BlockConfig(d_model=8, n_heads=2), seed=0)
    trace = blocktrace.trace(block, torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(0)))
    cell = tmp_path / "cell.html"
    cell.write_text(f"<!doctype html><html><body><p>a notebook cell</p>{trace_frame(trace)}</body></html>",
                    encoding="utf-8")
    tab.errors.clear()
    tab.requests.clear()
    tab.goto(cell.as_uri())
    frame = tab.frame_locator("iframe")
    frame.locator("#page > *").first.wait_for()
    report = trace_report(trace)
    for step in report["steps"]:
        cells = frame.locator(f'table.steps tr[data-step="{step["name"]}"] td[data-name]')
        drawn = [float(v) for v in cells.evaluate_all("cs => cs.map(c => c.dataset.value)")]
        assert drawn == [step["stats"][s] for s in ("mean", "std", "min", "max", "rms", "absmax")]
    assert tab.errors == [] and tab.requests == []
