"""The HTML report in a real browser (headless Chromium, every network request blocked): it loads
with no console errors, its diagrams and charts draw, the op table filters and sorts, a click on
a block opens its view, and the devices' timeline draws from the embedded trace."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import graphllm
from graphllm.exporters.html import write_page
from graphllm.models.hardware import load_hardware
from graphllm.models.workload import Workload
from graphllm.passes.parallel.partition import Strategy
from graphllm.report.html import report_data
from tests.support.paths import EXAMPLES

# blank pixels of a canvas: Chart.js draws on a transparent one
PAINTED = """(id) => { const c = document.getElementById(id);
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n; }"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    config = graphllm.load_config(EXAMPLES / "tiny.yaml")
    wl = Workload(batch=2, seq_len=8, dtype="fp32")
    data = report_data(config, wl, load_hardware("h100"), Strategy(tp=2), sweep_lens=[2, 8, 32])
    path = write_page(tmp_path_factory.mktemp("report") / "report.html", data)
    return path, data


def _rows(view):
    return view.page.locator("#op-table tbody tr")


def test_loads_offline_with_no_errors_and_draws(open_page, report):
    path, data = report
    view = open_page(path)
    page = view.page
    assert page.locator("#diagram-view svg").count() == 1
    assert page.locator("#diagram-view").get_attribute("data-view") == "model"
    charts = page.evaluate("Object.keys(window.graphllmReport.charts).sort()")
    assert charts == ["op", "roofline", "scope", "sweep"]
    for canvas in ("chart-scope", "chart-op", "chart-sweep", "chart-roofline"):
        assert page.evaluate(PAINTED, canvas) > 1000, canvas
    assert page.locator("#summary-table tr").count() == len(data["summary"])
    assert _rows(view).count() == len(data["ops"]["rows"])
    assert view.errors == [] and view.blocked == []


def test_search_filters_the_table(open_page, report):
    path, data = report
    view = open_page(path)
    wanted = [r for r in data["ops"]["rows"] if any("q_proj" in str(r[c]) for c in (0, 1, 2))]
    assert 0 < len(wanted) < len(data["ops"]["rows"])
    view.page.fill("#op-search", "q_proj")
    assert _rows(view).count() == len(wanted)
    assert view.page.inner_text("#op-count") == f"{len(wanted)} of {len(data['ops']['rows'])} rows"
    view.page.fill("#op-search", "rmsnorm")  # an op kind
    assert _rows(view).count() == sum(1 for r in data["ops"]["rows"] if "rmsnorm" in r[1])
    view.page.fill("#op-search", "")
    assert _rows(view).count() == len(data["ops"]["rows"])
    assert view.errors == []


def test_sorting_by_flops_puts_the_largest_first(open_page, report):
    path, data = report
    view = open_page(path)
    cols = data["ops"]["columns"]
    f = cols.index("flops")
    view.page.click(f"#op-table th[data-col='{f}']")
    biggest = max(data["ops"]["rows"], key=lambda r: r[f])
    first = _rows(view).first.locator("td").first.inner_text()
    assert first == biggest[0]
    view.page.click(f"#op-table th[data-col='{f}']")  # again: smallest first
    smallest = min(data["ops"]["rows"], key=lambda r: r[f])
    assert (
        data["ops"]["rows"][
            [r[0] for r in data["ops"]["rows"]].index(
                _rows(view).first.locator("td").first.inner_text()
            )
        ][f]
        == smallest[f]
    )
    n = cols.index("name")
    view.page.click(f"#op-table th[data-col='{n}']")
    assert _rows(view).first.locator("td").first.inner_text() == min(
        r[0] for r in data["ops"]["rows"]
    )
    assert view.errors == []


def test_clicking_a_block_opens_its_view_and_then_attention(open_page, report):
    path, _ = report
    view = open_page(path)
    page = view.page
    page.locator(
        "#diagram-view g.node.link", has=page.locator("title", has_text="blocks:0")
    ).click()
    assert page.locator("#diagram-view").get_attribute("data-view") == "block-0"
    attention = page.locator(
        "#diagram-view g.node.link", has=page.locator("title", has_text="self_attn")
    )
    attention.click()
    assert page.locator("#diagram-view").get_attribute("data-view") == "attention-0"
    assert page.locator("#diagram-tabs button.on").inner_text() == "attention (layer 0)"
    assert view.errors == []


def test_devices_timeline_and_trace_download(open_page, report):
    path, data = report
    view = open_page(path)
    page = view.page
    assert page.locator("#partition").is_visible()
    page.wait_for_function("document.getElementById('timeline').dataset.events > 0")
    trace = json.loads(
        page.evaluate("fetch(document.getElementById('trace-download').href).then(r => r.text())")
    )
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert int(page.get_attribute("#timeline", "data-events")) == len(events)
    assert page.evaluate(PAINTED, "timeline") > 1000
    assert page.locator("#stage-table tr").count() == 13  # header + 12 rows
    kinds = {(c["kind"], c["mesh_axis"]) for c in data["partition"]["collectives"]}
    assert page.locator("#collective-table tr").count() == 1 + len(kinds)
    assert view.errors == [] and view.blocked == []


def test_screenshot(open_page, report, tmp_path):
    """A picture of the page (GRAPHLLM_REPORT_SCREENSHOT=PATH keeps a copy: docs/report.png)."""
    path, _ = report
    view = open_page(path)
    shot = tmp_path / "report.png"
    view.page.screenshot(path=str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    keep = os.environ.get("GRAPHLLM_REPORT_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
