"""`graphllm report`: the page is written whole and the same every time; bad input is one line,
exit code 2, and no file."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from graphllm.cli import main
from tests.support.paths import EXAMPLES

TINY = str(EXAMPLES / "tiny.yaml")


def invoke(*args: str):
    return CliRunner().invoke(main, ["report", *args])


def test_same_input_same_bytes(tmp_path):
    a, b = tmp_path / "a.html", tmp_path / "b.html"
    for out in (a, b):
        r = invoke("--config", TINY, "--tp", "2", "--sweep", "4,8", "-o", str(out))
        assert r.exit_code == 0, r.output
        assert f"wrote {out} (" in r.stdout and "report of tiny" in r.stdout
    assert a.read_bytes() == b.read_bytes()
    text = a.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.count("</script>") == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.html", "b.html"]  # no temporaries


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config", TINY, "-o", "{d}/r.png"], "give a .html file"),
        (["--model", "no-such-model", "-o", "{d}/r.html"], "no-such-model"),
        (["--config", TINY, "-o", "{d}/missing/r.html"], "does not exist"),
        (["--config", TINY, "--tp", "3", "-o", "{d}/r.html"], "tp"),
        (["--config", TINY, "--zero", "1", "-o", "{d}/r.html"], "--training"),
        (["--config", TINY, "--sweep", "0", "-o", "{d}/r.html"], "positive"),
    ],
)
def test_bad_input_is_one_line_and_no_file(tmp_path, args, message):
    r = invoke(*(a.format(d=tmp_path) for a in args))
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_failure_leaves_the_old_report_as_it_was(tmp_path):
    out = tmp_path / "r.html"
    out.write_text("old")
    r = invoke("--config", TINY, "--tp", "3", "-o", str(out))
    assert r.exit_code == 2
    assert out.read_text() == "old" and list(tmp_path.iterdir()) == [out]
