"""Every bar of a category chart in the HTML report carries its own label: Chart.js skips the
labels it finds crowded (`ticks.autoSkip`), which named the largest bars of a model with many op
kinds after their neighbours."""

from __future__ import annotations

import pytest

import graphllm
from graphllm.exporters.html import write_page
from graphllm.models.hardware import load_hardware
from graphllm.models.workload import Workload
from graphllm.passes.parallel.partition import Strategy
from graphllm.report.html import report_data

# the labels each chart's category axis drew, in order, beside its data's labels
DRAWN = """(name) => { const c = window.graphllmReport.charts[name];
  const axis = c.scales[c.options.indexAxis === 'y' ? 'y' : 'x'];
  return { drawn: axis.ticks.map((t) => axis.getLabelForValue(t.value)),
           items: axis._labelItems.map((i) => i.label), labels: c.data.labels,
           height: c.height }; }"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    config = graphllm.load_config("qwen3-next-80b-a3b")
    wl = Workload(batch=1, seq_len=64, dtype="bf16")
    data = report_data(config, wl, load_hardware("h100"), Strategy(), sweep_lens=[64, 256])
    path = write_page(tmp_path_factory.mktemp("report") / "report.html", data)
    return path, data


@pytest.mark.parametrize(("chart", "table"), [("op", "by_op"), ("scope", "by_scope")])
def test_every_category_has_its_label(open_page, report, chart, table):
    path, data = report
    view = open_page(path)
    got = view.page.evaluate(DRAWN, chart)
    labels = list(data["breakdown"][table])
    assert got["labels"] == labels
    if chart == "op":
        assert len(labels) > 20  # crowded enough that Chart.js skipped every other one
    assert got["drawn"] == labels
    assert got["items"] == labels  # what was painted, not only what was kept
    # tall enough that the labels do not overlap (12px text)
    assert got["height"] >= 14 * len(labels)
    assert view.errors == []
