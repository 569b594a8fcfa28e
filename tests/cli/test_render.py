"""`graphllm render`: files written whole, one-line errors with exit code 2."""

import shutil

import pytest
from click.testing import CliRunner

from graphllm.cli import main
from tests.support.paths import EXAMPLES

ARTICLE = str(EXAMPLES / "article.yaml")


def invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(main, ["render", *args], env=env)


@pytest.mark.parametrize("view", ["model", "block", "attention", "ffn", "tokens"])
def test_render_each_view_with_the_fallback(tmp_path, view):
    out = tmp_path / f"{view}.svg"
    r = invoke("--config", ARTICLE, "--view", view, "-o", str(out), "--renderer", "pure")
    assert r.exit_code == 0, r.output
    assert f"wrote {out} ({view} view of article, renderer: pure)" in r.stdout
    assert out.read_text().lstrip().startswith("<?xml")


def test_render_options(tmp_path):
    out = tmp_path / "t.dot"
    r = invoke("--model", "mistral-7b", "--view", "tokens", "--tokens", "5", "--layer", "31",
               "-o", str(out))  # fmt: skip
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert '"token 5"' in text and "model.layers.31." in text and "renderer: none" in r.stdout
    out = tmp_path / "c.svg"
    r = invoke("--config", ARTICLE, "--view", "attention", "--color", "time", "--hardware",
               "a100", "-o", str(out), env={"GRAPHLLM_RENDERER": "pure"})  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "roofline time:" in out.read_text() and "renderer: pure" in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--view", "heads"], "'heads' is not one of"),
        (["--view", "model", "-o", "m.jpg"], "'.jpg' is not a format to draw"),
        (["--view", "block", "--layer", "2", "-o", "b.svg"], "--layer 2: the model has 1 layer"),
        (["--view", "model", "-o", "m.pdf", "--renderer", "pure"], "PDF needs Graphviz's dot"),
        (["--view", "model", "-o", "no/such/dir/m.dot"], "folder no/such/dir does not exist"),
        (["--view", "tokens", "--tokens", "40", "-o", "t.svg"], "40 is not in the range"),
    ],
)
def test_user_errors_exit_2_with_one_line(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    r = invoke("--config", ARTICLE, *args)
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert list(tmp_path.iterdir()) == []
    if not r.output.startswith("Usage:"):  # click's own usage errors aside: one line
        assert r.output.startswith("error: ") and r.output.count("\n") == 1


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot binary is not installed")
def test_pdf_with_graphviz(tmp_path):
    out = tmp_path / "m.pdf"
    r = invoke("--config", ARTICLE, "--view", "model", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert out.read_bytes().startswith(b"%PDF")


def test_block_view_with_strategies_draws_collectives_and_shards(tmp_path):
    from click.testing import CliRunner

    from graphllm.cli import main

    out = tmp_path / "b.dot"
    r = CliRunner().invoke(
        main, ["render", "--model", "llama3-70b", "--view", "block", "--tp", "8", "-o", str(out)]
    )
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert text.count('shape="hexagon"') == 2  # o_proj and down_proj all-reduces, in place
    assert "all_reduce over tp (8 ranks)" in text
    assert "rank r holds heads 8r..8r+7" in text and "ffn/8 per rank" in text
    out = tmp_path / "m.dot"
    r = CliRunner().invoke(
        main, ["render", "--model", "mixtral-8x7b", "--view", "block", "--ep", "8", "-o", str(out)]
    )
    assert r.exit_code == 0 and "rank r holds expert r" in out.read_text()
    r = CliRunner().invoke(
        main, ["render", "--model", "llama3-8b", "--view", "ffn", "--tp", "2", "-o", str(out)]
    )
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
