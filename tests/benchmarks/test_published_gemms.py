"""benchmarks/published_gemms.py: graphllm's roofline time of a matmul beside published GEMM
microbenchmarks at LLM shapes. Each row's time is read from its quoted TFLOP/s; the prediction is
the roofline pass's own time of the matmul, checked here against the model by hand."""

import re
import statistics

import pytest

from graphllm.models.hardware import load_hardware
from tests.support.benchmark_scripts import load_script, run_script, script_json


@pytest.fixture(scope="module")
def doc():
    return script_json("published_gemms")


def test_every_row_is_a_quoted_measurement_with_a_prediction(doc):
    assert doc["rate_model"] == "achievable" and doc["rows"] >= 15
    ratios = []
    for t in doc["tables"]:
        assert t["source"].startswith("https://") and t["header"].startswith("batch_size")
        assert {r["dtype"] for r in t["rows"]} == {"bf16", "fp8"}
        assert {1, 128} <= {r["m"] for r in t["rows"]}  # a GEMV and a short prefill's GEMM
        names = load_script("published_gemms")._columns("t", t["header"])
        for r in t["rows"]:
            tflops = 2 * r["m"] * t["n"] * t["k"] / (r["measured_us"] * 1e-6) / 1e12
            col = next(c for c, d in t["columns"].items() if d == r["dtype"])
            fields = r["quote"].split()
            assert float(fields[1]) == r["m"]
            assert float(fields[2 + names.index(col)]) == pytest.approx(tflops, rel=1e-12), r
            assert r["ratio"] == pytest.approx(r["measured_us"] / r["predicted_us"])
            ratios.append(r["ratio"])
        assert t["median_ratio"] == pytest.approx(statistics.median(r["ratio"] for r in t["rows"]))
    assert doc["median_ratio"] == pytest.approx(statistics.median(ratios))


def test_the_prediction_is_the_roofline_by_hand():
    pub = load_script("published_gemms")
    table = pub.load_tables()[0]
    h100 = load_hardware("h100")
    n, k = table["n"], table["k"]
    # M = 1 in bf16: the weight streams at h100's 2.84 TB/s, plus the 3.43 us fixed cost of a
    # kernel that streams from DRAM, launched on its own (a prefill is not in a CUDA graph)
    byts = 2 * (n * k + k + n)
    assert pub.predict_seconds(table, 1, "bf16") == pytest.approx(byts / 2.84e12 + 3.43e-6)
    # M = 128 in fp8: still below the ridge; 96 tiles of 128 x 128 on 132 SMs
    assert h100.achievable.gemm_efficiency(128, n, k) == pytest.approx(96 / 132)
    flops = 2 * 128 * n * k
    assert (h100.gemm_rate("fp8"), h100.bandwidth()) == (1402.6e12, 2.84e12)
    assert flops / (1402.6e12 * 96 / 132) < (n * k + 2 * 128 * (k + n)) / 2.84e12
    # W8A8: the FP8 weight, and the activation in and the output out in the 16-bit stream
    # (scaled_mm writes bf16 too; it reads the FP8 copy a quantize wrote, 0.7 MB less here)
    want = (n * k + 2 * 128 * (k + n)) / 2.84e12 + 3.43e-6
    assert pub.predict_seconds(table, 128, "fp8") == pytest.approx(want)


def test_the_columns_are_the_headers_and_a_row_cut_short_gives_the_ones_it_has():
    pub = load_script("published_gemms")
    qkv, gate_up = pub.load_tables()
    # qkv at M = 128: bf16 is the first column (352.56), fp8 without quantising the third
    # (581.82), not the second (505.74, which quantises the activations first)
    got = {d: s for m, d, s, _ in qkv["rows"] if m == 128}
    flops = 2 * 128 * 12288 * 5376
    assert got == {
        "bf16": pytest.approx(flops / 352.560566e12),
        "fp8": pytest.approx(flops / 581.821280e12),
    }
    assert [(m, d) for m, d, _, _ in gate_up["rows"] if m == 256] == [(256, "bf16")]


def test_a_bad_row_or_header_is_refused(tmp_path):
    pub = load_script("published_gemms")
    text = pub.TABLE.read_text()
    bad = tmp_path / "t.yaml"
    for old, new, msg in (
        ("581.821280 ...", "581.821280", "a row of 3 values for 4"),  # short, not marked
        ("4.733311 5.162899", "4.733311", "a row of 3 values for 4"),  # a value missing
        ("4.907601", "4.907601 9.9", "a row of 5 values for 4"),
        ("2.870333", "2.87x", "not a row of numbers"),
        ("2.870333", "0", "TFLOP/s above 0"),
        ("0 1.0 2.870333", "0 1.5 2.870333", "M a whole count"),
        ('header: "batch_size', 'header: "batch', "its header must be batch_size"),
        ("hardware: h100-sxm", "hardware: h1000", "h1000"),
        ("n: 12288", "n: 12289", "n a multiple of 128"),
    ):
        bad.write_text(text.replace(old, new, 1))
        with pytest.raises(SystemExit, match=re.escape(msg)):
            pub.load_tables(bad)
    out = run_script("published_gemms", "--table", str(bad))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr


def test_a_table_without_its_fields_a_url_or_its_columns_is_refused(tmp_path):
    pub = load_script("published_gemms")
    bad = tmp_path / "t.yaml"
    bad.write_text("tables:\n  - id: x\n    gpus: y\n")
    with pytest.raises(SystemExit, match="lacks"):
        pub.load_tables(bad)
    text = pub.TABLE.read_text()
    bad.write_text(text.replace("source: https://", "source: http://", 1))
    with pytest.raises(SystemExit, match="must be a URL"):
        pub.load_tables(bad)
    bad.write_text(text.replace("torch-bf16: bf16", "torch-bf17: bf16", 1))
    with pytest.raises(SystemExit, match="column 'torch-bf17'"):
        pub.load_tables(bad)
    bad.write_text("tables: 3\n")
    with pytest.raises(SystemExit, match="needs `tables:`"):
        pub.load_tables(bad)
