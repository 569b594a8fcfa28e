"""exporters/html: the page is one file whose embedded data cannot break out of its script."""

from __future__ import annotations

import json
import re

from graphllm.exporters.html import CHARTJS, CHARTJS_VERSION, page_html

DATA = {
    "title": "</script><script>alert(1)</script> & <b>",
    "summary": [["x", "a\u2028b <!-- c -->"]],
    "z": 1,
    "a": {"b": 2, "a": 1},
}


def _embedded(page: str) -> str:
    return re.search(
        r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S
    )[1]


def test_data_cannot_end_its_script_and_reads_back():
    page = page_html(DATA)
    assert page.count("</script>") == 3  # the data's, Chart.js's and the page's own
    assert "<script>alert" not in page
    text = _embedded(page)
    assert "<" not in text and "\u2028" not in text
    assert json.loads(text) == DATA
    assert (
        "<title>&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;b&gt;</title>"
        in page
    )


def test_keys_sorted_so_insertion_order_does_not_change_the_bytes():
    flipped = {k: DATA[k] for k in reversed(DATA)} | {"a": {"a": 1, "b": 2}}
    assert page_html(flipped) == page_html(DATA)
    assert _embedded(page_html(DATA)).startswith('{"a":{"a":1,"b":2}')


def test_chartjs_is_the_pinned_build_inlined_without_its_source_map():
    page = page_html(DATA)
    assert f"Chart.js v{CHARTJS_VERSION}" in CHARTJS.read_text()
    assert f"Chart.js v{CHARTJS_VERSION}" in page
    assert "sourceMappingURL" in CHARTJS.read_text() and "sourceMappingURL" not in page
    assert re.search(r"""(src|href)=["']?https?:""", page) is None
