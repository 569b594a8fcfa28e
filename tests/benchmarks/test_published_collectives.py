"""benchmarks/published_collectives.py: graphllm's alpha-beta collective times beside published
nccl-tests runs. Each table's rows are quoted and parsed from the quote; the predictions are the
partition pass's own `collective_seconds`, checked here by hand."""

import json
import re
import statistics

import pytest

from tests.support.benchmark_scripts import load_script, run_script, script_json


@pytest.fixture(scope="module")
def doc():
    return script_json("published_collectives")


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
        pub.parse_line("2097152 524287 float sum -1 31.27 67.06 100.59 0 30.21 69.42 104.12 0")
    with pytest.raises(SystemExit, match="not an nccl-tests row"):
        pub.parse_line("# Avg bus bandwidth : 124.806")
    with pytest.raises(SystemExit, match="13 columns"):  # cut short
        pub.parse_line("2097152 524288 float sum -1 31.27 67.06 100.59 0")
    with pytest.raises(SystemExit, match="algbw is not size / time"):  # 31.27 copied as 21.27
        pub.parse_line("2097152 524288 float sum -1 21.27 67.06 100.59 0 30.21 69.42 104.12 0")
    with pytest.raises(SystemExit, match="not a number"):
        pub.parse_line("2097152 524288 float sum -1 31.x7 67.06 100.59 0 30.21 69.42 104.12 0")
    table = next(t for t in pub.load_tables() if t["id"] == "h100x4 nccl-collectives-bench")
    assert (2097152, pytest.approx(31.27e-6)) in table["rows"]


def test_the_prediction_is_nccls_tuner_by_hand():
    pub = load_script("published_collectives")
    table = next(t for t in pub.load_tables() if t["id"] == "h100x4 nccl-collectives-bench")
    # 2 MiB over 4 H100s: the ring's LL, 6.6 us + 6 NVLink hops of 0.6 us, and 2 MiB over LL's
    # bandwidth, min(141 GB/s, half of 370) x the ring's 4 / 6
    got, pick = pub.predict(table, 2097152)
    assert pick == "ring LL"
    assert got == pytest.approx(10.2e-6 + 2097152 / (141e9 * 4 / 6), rel=1e-12)
    # 8 MiB: LL128, 14 us + 6 hops of 1.9 us, at 0.92 of the bus bandwidth
    got, pick = pub.predict(table, 8 << 20)
    assert pick == "ring LL128"
    assert got == pytest.approx(25.4e-6 + (8 << 20) / (0.92 * 370e9 * 4 / 6), rel=1e-12)
    # 1 GiB over 8 ranks: the preset's NVLS, 80.8 us + 1 GiB at 274.13 GB/s, beats the ring's
    # Simple (8.4 us + 14 hops of 3.4 us, the whole bus bandwidth x 8 / 14)
    eight = next(t for t in pub.load_tables() if t["id"] == "h100x8 dgxc-benchmarking")
    got, pick = pub.predict(eight, 1 << 30)
    assert pick == "nvls"
    assert got == pytest.approx(80.8e-6 + (1 << 30) / 274.13e9, rel=1e-12)
    assert got < 56.0e-6 + (1 << 30) / (370e9 * 8 / 14)
    # 16 MiB: NVLS's latency loses to the ring's LL128 there
    got, pick = pub.predict(eight, 16 << 20)
    assert pick == "ring LL128"
    assert got == pytest.approx(40.6e-6 + (16 << 20) / (0.92 * 370e9 * 8 / 14), rel=1e-12)
    # the A100's NVLink: 200 GB/s, whose half Ampere's LL cap of 87.7 GB/s holds down
    a100 = next(t for t in pub.load_tables() if t["hardware"] == "a100-sxm-80gb")
    got, pick = pub.predict(a100, 1 << 20)
    assert pick == "ring LL"
    assert got == pytest.approx(10.2e-6 + (1 << 20) / (87.7e9 * 4 / 6), rel=1e-12)


def test_nccls_tuner_meets_the_runs_launched_as_engines_launch_them(doc):
    """The one-process-a-GPU run (how engines and torch.distributed launch NCCL) and the 4-GPU
    runs' mid sizes, where a single bandwidth and step latency had been 1.3-1.7x fast."""
    tables = {t["id"]: t for t in doc["tables"]}
    dgx = tables["h100x8 dgxc-benchmarking"]["median_ratio_by_band"]
    assert 0.9 <= dgx["below 1 MiB"] <= 1.15 and 0.9 <= dgx["1-256 MiB"] <= 1.1
    # from 32 MiB NVLS: the 8-GPU node nobody's figures went into the preset from (its ring
    # alone was 0.77 from 1 GiB up, at 370 GB/s busbw where NVLS reached 480)
    large = tables["h100x8 dgxc-benchmarking"]["rows"]
    assert all(0.95 <= r["ratio"] <= 1.06 for r in large if r["bytes"] >= 32 << 20)
    assert {r["nccl_pick"] for r in large if r["bytes"] >= 32 << 20} == {"nvls"}
    for four in ("h100x4 nccl-collectives-bench", "h100x4 lambda"):
        rows = tables[four]["rows"]
        mid = [r["ratio"] for r in rows if 2 << 20 <= r["bytes"] < 256 << 20]
        assert min(mid) >= 0.95 and max(mid) <= 1.1, four
        # the large ring: Simple at the measured busbw
        assert 0.97 <= rows[-1]["ratio"] <= 1.06
        assert {r["nccl_pick"] for r in rows} == {"ring LL", "ring LL128", "ring Simple"}


def test_band_medians_and_the_fit(doc):
    pub = load_script("published_collectives")
    for t in doc["tables"]:
        bands = t["median_ratio_by_band"]
        below = [r["ratio"] for r in t["rows"] if r["bytes"] < 1 << 20]
        mid = [r["ratio"] for r in t["rows"] if 1 << 20 <= r["bytes"] < 256 << 20]
        top = [r["ratio"] for r in t["rows"] if r["bytes"] >= 256 << 20]
        assert bands["below 1 MiB"] == pytest.approx(statistics.median(below))
        assert bands["1-256 MiB"] == pytest.approx(statistics.median(mid))
        assert bands.get("256 MiB up") == (pytest.approx(statistics.median(top)) if top else None)
        # the fit is through the rows from 1 MiB up, against the bytes each device sends
        n = t["ranks"]
        pts = [(2 * (n - 1) / n * r["bytes"], r["measured_us"] * 1e-6) for r in t["rows"]]
        alpha, bw = pub.fit([(x, y) for (x, y), r in zip(pts, t["rows"]) if r["bytes"] >= 1 << 20])
        assert t["fit_from_1MiB"] == {
            "alpha_us": pytest.approx(alpha * 1e6),
            "bus_bandwidth_GBps": pytest.approx(bw / 1e9),
        }
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
    text = pub.TABLE.read_text()
    for old, new, msg in (
        ("processes: 8", "processes: 1", "nThread 1 x nGpus 1 x 1 processes is not its 8 ranks"),
        ("processes: 8", "processes: eight", "processes must be a positive whole number"),
        ("hardware: h100-sxm", "hardware: h1000", "h1000"),
        ("each call captured in a CUDA graph (-G)", "eager", "graph: 1 and its launch disagree"),
        ("collective: all_reduce", "collective: rmsnorm", "'rmsnorm' is not a collective"),
    ):
        bad.write_text(text.replace(old, new, 1))
        with pytest.raises(SystemExit, match=re.escape(msg)):
            pub.load_tables(bad)
    bad.write_text("rows: []\n")
    with pytest.raises(SystemExit, match="needs `tables:`"):
        pub.load_tables(bad)


def test_a_bad_table_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "t.yaml"
    bad.write_text("tables: [x]\n")
    out = run_script("published_collectives", "--table", str(bad))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().endswith("needs `tables:`, a list of tables")
    assert len(out.stderr.strip().splitlines()) == 1
    bad.write_text("tables: [\n")
    out = run_script("published_collectives", "--table", str(bad))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_main_runs_in_process_too(capsys):
    assert load_script("published_collectives").main(["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rate_model"] == "achievable"


def test_the_header_is_read_by_key_whatever_words_lie_between():
    pub = load_script("published_collectives")
    keys = ("nThread", "nGpus", "maxBytes", "graph")
    head = "# nThread 1 nGpus 4 maxBytes 64 step: 2(factor) warmup iters: 5 agg iters: 1 graph: 1"
    assert pub._header(head, keys) == {"nThread": "1", "nGpus": "4", "maxBytes": "64", "graph": "1"}
    # pairing words two by two would read `iters` as a key and `graph`'s value as a key's
    assert pub._header(head.replace("agg iters: 1 ", ""), keys)["graph"] == "1"
