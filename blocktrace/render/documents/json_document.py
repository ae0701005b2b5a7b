"""`--json`: one strict JSON document. NaN and ±Inf are not JSON: each becomes null, and the
document lists where they were under `non_finite` (JSON paths), so nothing is lost."""

from __future__ import annotations

import json
import math
from typing import Optional

from blocktrace.render.documents import Document


def _strict(value, path: str, found: list):
    if isinstance(value, float) and not math.isfinite(value):
        found.append({"path": path, "value": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")})
        return None
    if isinstance(value, dict):
        return {key: _strict(item, f"{path}.{key}", found) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(item, f"{path}[{index}]", found) for index, item in enumerate(value)]
    return value


def dumps(report: dict, indent: Optional[int] = 2) -> str:
    """The document; `indent=None` writes it compact (the HTML page embeds it: an attention map's thousands of
    numbers one per line would triple the page)."""
    found: list = []
    clean = _strict(report, "$", found)
    if found:
        clean["non_finite"] = found
    separators = None if indent is not None else (",", ":")
    return json.dumps(clean, ensure_ascii=False, indent=indent, separators=separators, allow_nan=False)


DOCUMENT = Document("--json", "Print one JSON document (its fields in the command's page under docs/) instead of "
                    "tables.", dumps)
