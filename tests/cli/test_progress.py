"""Progress of long work: export's bytes written and plan's layouts tried, told to a callback
that the CLI draws as a bar on stderr only at a terminal and never under --json."""

import io
import sys

from click.testing import CliRunner

from graphllm.build.builder import build_export_graph
from graphllm.cli import main
from graphllm.cli import progress as progress_mod
from graphllm.exporters.onnx import export_onnx
from graphllm.models.config import load_config
from graphllm.models.hardware import load_hardware
from graphllm.models.workload import Workload
from graphllm.passes.parallel.plan import factorisations, plan
from tests.support.paths import EXAMPLES


def test_export_tells_the_bytes_written(tmp_path):
    told = []
    graph = build_export_graph(load_config(EXAMPLES / "tiny.yaml"))
    r = export_onnx(graph, tmp_path / "m.onnx", ops="decomposed", check=False, progress=lambda d, t: told.append((d, t)))  # fmt: skip
    assert told[0] == (0, r.weight_bytes) and told[-1] == (r.weight_bytes, r.weight_bytes)
    assert [d for d, _ in told] == sorted(d for d, _ in told) and len(told) > 3


def test_plan_tells_the_layouts_tried():
    told = []
    cfg, hw = load_config("llama3-8b"), load_hardware("h100")
    plan(cfg, Workload(seq_len=16), 8, hw, progress=lambda d, t: told.append((d, t)))
    n = len(factorisations(8, {}, False))
    assert told == [(i, n) for i in range(n + 1)]


def test_bars_only_at_a_terminal_and_not_under_json(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Tty())
    assert progress_mod.showing() and not progress_mod.showing(as_json=True)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not progress_mod.showing()
    with progress_mod.bar("x", show=False) as told:
        assert told is None


def test_a_pipe_gets_no_bar(tmp_path):
    r = CliRunner().invoke(main, ["export", "--config", str(EXAMPLES / "tiny.yaml"), "-o", str(tmp_path / "m.onnx")])  # fmt: skip
    assert r.exit_code == 0 and r.stderr == ""
    r = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "-n", "8", "-t", "16", "--json"])
    assert r.exit_code == 0 and r.stderr == ""
