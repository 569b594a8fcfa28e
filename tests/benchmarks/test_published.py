"""benchmarks/published.py: graphllm's predictions beside published measurements. The script runs
on its own table; its output has a row per measurement, each with its source, and the summary."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "published.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def doc():
    out = _run("--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_every_row_is_a_sourced_quoted_measurement_with_a_prediction(doc):
    rows = doc["rows"]
    assert len(rows) >= 15
    metrics = {r["metric"] for r in rows}
    assert metrics == {"decode_tokens_per_s", "ttft_ms"}
    assert any(r["batch"] == 1 and r["metric"] == "decode_tokens_per_s" for r in rows)
    for r in rows:
        assert r["source"].startswith("https://") and r["quote"].strip(), r["id"]
        assert str(r["measured"]) in r["quote"] or f"{r['measured']:g}" in r["quote"], r["id"]
        assert r["predicted"] > 0
        if r["metric"] == "ttft_ms":
            assert r["ratio"] == pytest.approx(r["measured"] / r["predicted"])
        else:
            assert r["ratio"] == pytest.approx(r["predicted"] / r["measured"])
    assert doc["rate_model"] == "achievable"


def test_the_summary_is_the_median_and_the_rows_beyond_one_and_a_half(doc):
    import statistics

    judged = [r for r in doc["rows"] if r["batch"] == 1]
    s = doc["summary"]
    assert s["judged"] == len(judged) and s["rows"] == len(doc["rows"])
    assert s["median_ratio"] == pytest.approx(statistics.median(r["ratio"] for r in judged))
    beyond = [r["id"] for r in judged if not 1 / 1.5 <= r["ratio"] <= 1.5]
    assert s["beyond_1.5x"] == beyond


def test_the_text_prints_each_row_the_median_and_the_sources():
    out = _run()
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("predictions on the achievable rate model")
    assert "median of measured/predicted over" in text and "rows beyond 1.5x:" in text
    assert text.count("source [") >= 15
