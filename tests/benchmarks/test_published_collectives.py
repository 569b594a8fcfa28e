"""benchmarks/published_collectives.py: graphllm's alpha-beta collective times beside published
nccl-tests runs. Each table's rows are quoted and parsed from the quote; the predictions are the
partition pass's own `collective_seconds`, checked here by hand."""

import json
import statistics

import pytest

from tests.support.benchmark_scripts import load_script, run_script


@pytest.fixture(scope="module")
def doc():
    out = run_script("published_collectives", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_every_table_is_a_sourced_quoted_run_with_its_launch_mode(doc):
    tables = doc["tables"]
    assert len(tables) >= 4
    assert {t["hardware"] for t in tables} >= {"h100-sxm", "a100-sxm-80gb"}
    assert {t["ranks"] for t in tables} >= {4, 8}
    for t in tables:
        assert t["source"].startswith("https://github.com/") and "/blob/" in t["source"]
        assert t["header"].startswith("# nThread"), t["id"]
        graph = "graph: 1" in t["header"]
        assert graph == ("CUDA graph" in t["launch"]) and (graph or "graph: 0" in t["header"])
        assert f"nGpus {t['ranks'] // t['processes']} " in t["header"], t["id"]
        assert len(t["rows"]) >= 10
        sizes = [r["bytes"] for r in t["rows"]]
        assert sizes == sorted(sizes) and sizes[0] == 8 and sizes[-1] >= 16 << 20
        for r in t["rows"]:
            assert r["ratio"] == pytest.approx(r["measured_us"] / r["predicted_us"])
    assert doc["rate_model"] == "achievable"
    assert any("graph: 1" in t["header"] for t in tables)  # a CUDA-graph run among them
    assert any(t["processes"] == t["ranks"] > 1 for t in tables)  # one process a GPU


def test_a_row_is_read_from_its_quote():
    pub = load_script("published_collectives")
    line = "2097152 524288 float sum -1 31.27 67.06 100.59 0 30.21 69.42 104.12 0"
    assert pub.parse_line(line) == (2097152, pytest.approx(31.27e-6))
    with pytest.raises(SystemExit, match="count x float"):
        pub.parse_line("2097152 524287 float sum -1 31.27 67.06 100.59 0")
    with pytest.raises(SystemExit, match="not an nccl-tests row"):
        pub.parse_line("# Avg bus bandwidth : 124.806")
    table = next(t for t in pub.load_tables() if t["id"] == "h100x4 nccl-collectives-bench")
    assert (2097152, pytest.approx(31.27e-6)) in table["rows"]


def test_the_prediction_is_the_alpha_beta_time_by_hand():
    pub = load_script("published_collectives")
    table = next(t for t in pub.load_tables() if t["id"] == "h100x4 nccl-collectives-bench")
    # 4 ranks: a tree all-reduce's 2 log2(4) = 4 steps at h100's 3 us, and the ring's
    # 2 (n-1)/n of 2 MiB over NVLink's 370 GB/s bus bandwidth
    want = 4 * 3e-6 + 1.5 * 2097152 / 370e9
    assert pub.predict_seconds(table, 2097152) == pytest.approx(want, rel=1e-12)


def test_band_medians_and_the_fit(doc):
    pub = load_script("published_collectives")
    for t in doc["tables"]:
        below = [r["ratio"] for r in t["rows"] if r["bytes"] < 1 << 20]
        assert t["median_ratio_by_band"]["below 1 MiB"] == pytest.approx(statistics.median(below))
    # the fit recovers a line it is given
    alpha, bw = pub.fit([(x, 20e-6 + x / 350e9) for x in (1e6, 4e6, 16e6, 64e6)])
    assert (alpha, bw) == (pytest.approx(20e-6), pytest.approx(350e9))


def test_a_table_without_its_fields_or_a_url_is_refused(tmp_path):
    pub = load_script("published_collectives")
    bad = tmp_path / "t.yaml"
    bad.write_text("tables:\n  - id: x\n    gpus: y\n")
    with pytest.raises(SystemExit, match="lacks"):
        pub.load_tables(bad)
    text = pub.TABLE.read_text().replace("source: https://", "source: http://", 1)
    bad.write_text(text)
    with pytest.raises(SystemExit, match="must be a URL"):
        pub.load_tables(bad)
    bad.write_text(pub.TABLE.read_text().replace("processes: 8", "processes: 1", 1))
    with pytest.raises(SystemExit, match="nGpus x 1 processes is not its 8 ranks"):
        pub.load_tables(bad)
