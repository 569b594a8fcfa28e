"""The interactive HTML report as one self-contained file.

The page is `template.html` with its styles (`report.css`), its script (`report.js`), Chart.js
(`vendor/`, pinned, MIT) and the report's data inlined: nothing is fetched when it is viewed, so
it works from file:// and offline, and its Content-Security-Policy forbids any fetch anyway. The
data (graphllm.report.html) is embedded as canonical JSON (sorted keys, no NaN), so the same
input gives the same bytes.
"""

from __future__ import annotations

import html
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from graphllm.files import finite, write_atomic

HERE = Path(__file__).parent
CHARTJS = HERE / "vendor" / "chart.umd.min.js"
CHARTJS_VERSION = "4.4.9"
_SOURCE_MAP = re.compile(r"//# sourceMappingURL=\S*\s*$")


@cache
def _asset(name: str) -> str:
    return (HERE / name).read_text(encoding="utf-8")


def _script_safe(text: str) -> str:
    """JSON that cannot end the <script> holding it (`</script>`, `<!--`) nor break JavaScript
    parsing (U+2028/9)."""
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def page_html(data: dict[str, Any]) -> str:
    """The report page for `data` (graphllm.report.html.report_data's dict)."""
    chartjs = _SOURCE_MAP.sub("", _asset("vendor/chart.umd.min.js"))
    parts = {
        "@@TITLE@@": html.escape(str(data.get("title", "graphllm report"))),
        "@@CSS@@": _asset("report.css"),
        "@@DATA@@": _script_safe(_canonical_json(data)),
        "@@CHARTJS@@": chartjs,
        "@@JS@@": _asset("report.js"),
    }
    return re.sub(
        "|".join(map(re.escape, parts)), lambda m: parts[m.group()], _asset("template.html")
    )


def _canonical_json(doc: Any) -> str:
    """Strict JSON (no NaN: files.finite), keys sorted, no spaces: one text for one document."""
    return json.dumps(finite(doc), sort_keys=True, separators=(",", ":"), allow_nan=False)


def write_page(path: str | Path, data: dict[str, Any]) -> Path:
    """Write the report page to `path`, whole or not at all."""
    text = page_html(data)
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
