"""`--html FILE`: the report as one self-contained page — its styles and script inlined, nothing fetched —
drawn in the reader's browser from the very document `--json` prints (embedded in the page), so every number on
it is the JSON's. Headings in English or Chinese (`--lang` chooses the first; a button switches), tokens in the
browser's own fonts. The page's script and styles live beside this module (page/page.js, page/page.css)."""

from __future__ import annotations

import base64
import functools
import html
import re
from pathlib import Path
from typing import Optional

from blocktrace.config import BlockConfig, parallel_of
from blocktrace.errors import BlocktraceError
from blocktrace.files import write_atomically
from blocktrace.render.documents.json_document import dumps
from blocktrace.render.translate import page_words
from blocktrace.render.words import explained_steps
from blocktrace.vocab import Lang, Placement, ReportKind
from blocktrace.wiring import wiring_of

ASSETS = Path(__file__).resolve().parent / "page"
# The Chinese glyphs of blocktrace's own words (Noto Sans CJK SC, SIL OFL 1.1) and the characters they cover, both
# written by scripts/make_page_font.py: a page carries them, so that its Chinese reads without a CJK font.
CJK_FONT, CJK_COVERED = ASSETS / "cjk.woff", ASSETS / "cjk.txt"
CJK = re.compile("[\u2e80-\u9fff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef]")  # CJK scripts, marks and punctuation
OWN_WORDS = [ASSETS / "page.js", Path(__file__).resolve().parent / "words.py",
             Path(__file__).resolve().parent / "phrases_zh.py"]
TUTORIAL_TOKENS = "猫吃鱼"  # the seeds' example (README's first command)
TEMPLATE = """<!doctype html>
<html lang="{lang}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
{font}{css}</style>
</head>
<body>
<header id="top"></header>
<main id="page"></main>
<div id="tip" role="tooltip" hidden></div>
<script type="application/json" id="report">{data}</script>
<script type="application/json" id="defaults">{defaults}</script>
<script type="application/json" id="explain">{explain}</script>
<script type="application/json" id="words">{words}</script>
<script>
{js}</script>
</body>
</html>
"""


# Inside a <script> element the HTML parser ends the data at "</script" and enters an escaped state at "<!--"
# (where a "<script" makes "</script>" no longer end it): no "<" may reach it. "<", ">" and "&" only occur inside
# JSON strings, where "\u003c" is the same character, so the document JSON.parse reads is unchanged.
SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def block_defaults(config) -> Optional[dict]:
    """blocktrace's own settings for a block of the report's size (BlockConfig's defaults at its d_model and
    n_heads), against which the page says which of the block's settings differ; None for a config it cannot read
    (a user's block, described by its module)."""
    if not isinstance(config, dict):
        return None
    try:
        return BlockConfig(d_model=config["d_model"], n_heads=config["n_heads"]).to_dict()
    except (KeyError, TypeError, BlocktraceError):
        return None


def step_explanations(report: dict) -> Optional[dict]:
    """What each of a block's steps does (the sentences `run --explain` prints), in each language, by step name;
    None for a report that is not one block of blocktrace's own config."""
    config = report.get("config")
    if report.get("kind") != ReportKind.BLOCK.value or not isinstance(config, dict) or "placement" not in config:
        return None
    wiring = wiring_of(Placement(config["placement"]),
                       parallel_of(config.get("parallel_residual", False), config.get("one_norm", False)))
    said = {language: explained_steps(language, wiring) for language in Lang}
    return {language.value: {step["name"]: said[language][step["name"]] for step in report["steps"]
                             if step["name"] in said[language]} for language in Lang}


def cjk_characters(text: str) -> set[str]:
    return set(CJK.findall(text))


def own_chinese() -> str:
    """Every Chinese character blocktrace's own words can put on a page (and the tutorials' tokens)."""
    return "".join(path.read_text(encoding="utf-8") for path in OWN_WORDS) + TUTORIAL_TOKENS


@functools.lru_cache(maxsize=1)
def _font() -> tuple[str, frozenset]:
    """The @font-face of the page's Chinese glyphs and the characters it covers."""
    data = base64.b64encode(CJK_FONT.read_bytes()).decode("ascii")
    face = (f'@font-face {{ font-family: "blocktrace CJK"; src: url(data:font/woff;base64,{data}) format("woff"); }}\n'
)
    return face, frozenset(CJK_COVERED.read_text(encoding="utf-8"))


def chinese_font(document: str) -> tuple[str, dict]:
    """The font every page carries (its button switches any page to Chinese: 116 KB of the page) and what the page
    says of it: the report's Chinese characters it lacks (its tokens'), which only the reader's own fonts draw.
    Every page, not only those that start in Chinese: Chromium keeps the boxes it drew for text without a font,
    and draws them again on the next page that brings one."""
    face, covered = _font()
    return face, {"uncovered": "".join(sorted(cjk_characters(document) - covered))}


def html_page(report: dict, title: str, lang: Lang = Lang.EN) -> str:
    """The page, its document embedded so that no string in it can end or break the <script> element; beside it
    (not in it: the document is --json's) the defaults its settings are told against, what each step does, and
    the document's sentences in Chinese; and the glyphs of blocktrace's own Chinese words."""
    data = dumps(report, indent=None).translate(SCRIPT_SAFE)
    defaults = dumps(block_defaults(report.get("config")), indent=None).translate(SCRIPT_SAFE)
    explain = dumps(step_explanations(report), indent=None).translate(SCRIPT_SAFE)
    font, font_note = chinese_font(data)
    words = dumps({**page_words(report), "font": font_note}, indent=None).translate(SCRIPT_SAFE)
    return TEMPLATE.format(lang=Lang(lang).value, title=html.escape(f"blocktrace: {title}"), data=data,
                           defaults=defaults, explain=explain, words=words, font=font,
                           css=(ASSETS / "page.css").read_text(encoding="utf-8"),
                           js=(ASSETS / "page.js").read_text(encoding="utf-8"))


def write_html(path: Path, report: dict, title: str, lang: Lang, force: bool) -> None:
    text = html_page(report, title, lang).encode("utf-8")
    write_atomically(Path(path), lambda handle: handle.write(text), force)
