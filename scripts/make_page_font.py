"""Writes blocktrace/render/page/cjk.woff (and cjk.txt, the characters it holds): the Chinese glyphs of blocktrace's own words, cut from Noto Sans CJK SC
(SIL Open Font License 1.1), so that a page in Chinese reads where the browser has no CJK font.

    python scripts/make_page_font.py [/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc]

Run it again whenever a Chinese sentence adds a character (tests/test_html.py fails on one the font lacks). The
characters are those of the page's words (page/page.js), the tables' and the findings' (render/words.py,
render/phrases_zh.py) and the tutorials' example tokens; a token outside them is drawn by the browser's own fonts,
and the page says when it has none (page.js: fontNote).
"""

from __future__ import annotations

import sys
from pathlib import Path

from fontTools import subset
from fontTools.ttLib import TTCollection

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from blocktrace.render.html import CJK_COVERED, CJK_FONT, cjk_characters, own_chinese  # noqa: E402

SOURCE = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")  # Debian's fonts-noto-cjk
FAMILY = "Noto Sans CJK SC"


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else SOURCE
    font = next(f for f in TTCollection(str(source)).fonts if f["name"].getDebugName(1) == FAMILY)
    text = "".join(sorted(cjk_characters(own_chinese()) | set("，。：；（）、")))
    options = subset.Options()
    options.flavor = "woff"  # zlib: no brotli needed to write or to test it (woff2 measured 9% smaller)
    options.layout_features = []
    options.hinting = False  # a third smaller; the glyphs are drawn at text sizes, where hints matter least
    options.name_IDs = ["*"]  # the license and its URL stay in the font
    subsetter = subset.Subsetter(options)
    subsetter.populate(text=text)
    subsetter.subset(font)
    font.flavor = "woff"
    font.save(str(CJK_FONT))
    CJK_COVERED.write_text(text, encoding="utf-8")
    print(f"{CJK_FONT.relative_to(ROOT)}: {len(text)} characters, {CJK_FONT.stat().st_size} bytes")


if __name__ == "__main__":
    main()
