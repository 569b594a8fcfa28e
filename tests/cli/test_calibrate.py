"""`graphllm calibrate` on the command line (tiny sizes, `--quick`), and `--hardware local` on
its tables."""

import json

import yaml
from click.testing import CliRunner

from graphllm.cli import main
from graphllm.models.hardware import load_hardware, local_path
from tests.support.paths import EXAMPLES


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_calibrate_writes_its_tables_and_trace_times_on_them(cache_dir):
    r = invoke("calibrate", "--quick", "--repeats", "1")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[1].startswith("read ")
    cal = yaml.safe_load(local_path().read_text())["calibration"]
    sizes = [p["bytes"] for p in cal["read_bandwidth"]]
    assert sizes == sorted(sizes) and sizes[0] == 1 << 20 and sizes[-1] == 4 << 20
    assert [(p["m"], p["k"], p["n"]) for p in cal["gemm"]] == [(1, 64, 64), (128, 64, 64)]
    assert cal["runtime"].startswith("onnxruntime ")  # what bench runs, as installed here
    hw = load_hardware("local")
    cfg = str(EXAMPLES / "tiny.yaml")
    r = invoke("trace", "--config", cfg, "--hardware", "local", "-t", "1", "--past-len", "7")
    assert r.exit_code == 0, r.output
    assert "times: calibrated model" in r.stdout
    doc = json.loads(invoke("trace", "--config", cfg, "--hardware", "local", "--json").stdout)
    roof = doc["roofline"]
    assert roof["rate_model"] == "calibrated"
    assert roof["bandwidth"] == hw.calibration.bandwidth_at(doc["bytes"]["total"])
    r = invoke("trace", "--config", cfg, "--hardware", "local", "--ideal", "--json")
    ideal = json.loads(r.stdout)["roofline"]
    assert ideal["rate_model"] == "ideal" and ideal["bandwidth"] == hw.memory_bandwidth


def test_calibrate_with_a_model_measures_its_gemm_shapes(cache_dir):
    cfg = str(EXAMPLES / "tiny.yaml")
    r = invoke("calibrate", "--quick", "--repeats", "1", "--config", cfg, "--budget", "0")
    assert r.exit_code == 0, r.output
    cal = load_hardware("local").calibration
    # --quick's own (64, 64) shape gives way to the model's: into and out of the FFN, LM head
    assert sorted({(k, n) for _, k, n, _ in cal.gemm}) == [(64, 128), (64, 256), (128, 64)]
    # a budget of 0 still measures the sweep's largest size and each shape's two ends of M
    assert [s for s, _ in cal.read_bandwidth] == [4 << 20]
    assert sorted(m for m, k, n, _ in cal.gemm if (k, n) == (64, 128)) == [1, 128]


def test_a_gemm_too_large_to_time_quickly_is_left_to_the_largest_m_below_it(monkeypatch):
    from graphllm.runtime import calibrate_tables

    monkeypatch.setattr(calibrate_tables, "GEMM_MAX_FLOP", 2.0 * 8 * 64 * 64)
    got = calibrate_tables.gemm_table([(64, 64)], (1, 4, 8, 128), 1, 1, 60.0)
    assert [m for m, *_ in got] == [1, 4, 8]  # 128 rows would be past the cap
    assert all(r > 0 for *_, r in got)
