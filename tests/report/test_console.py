"""Tables printed into a pipe or a file keep their full width; a terminal's width still wraps."""

from click.testing import CliRunner

from graphllm.cli import main
from graphllm.report.console import FULL_WIDTH, console


def test_a_pipe_gets_full_width(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert console().width == FULL_WIDTH and console(stderr=True).width == FULL_WIDTH
    r = CliRunner().invoke(main, ["plan", "--model", "llama3-70b", "-n", "8", "--hardware", "h100"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert "memory/device" in lines[1] or "memory/device" in lines[2]  # the header, uncut
    rows = [x for x in lines if x.startswith("│ ")]
    assert len(rows) == 5 and all("tp=" in x or "pp=" in x or "cp=" in x for x in rows)
    assert max(len(x) for x in lines) > 80


def test_columns_still_wins(monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    assert console().width == 60
