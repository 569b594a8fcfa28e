"""`graphllm bench` and runtime.bench: IO-bound steps equal plain runs, medians and predictions,
calibrating first when `local` has no calibration, the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from graphllm.build.builder import build_export_graph

ort = pytest.importorskip("onnxruntime")

import graphllm  # noqa: E402
from graphllm.cli import main  # noqa: E402
from graphllm.errors import GraphllmError  # noqa: E402
from graphllm.exporters.onnx import export_onnx  # noqa: E402
from graphllm.runtime.bench import bench, time_generation  # noqa: E402
from graphllm.runtime.session import BoundCache, OnnxModel  # noqa: E402
from tests.support.paths import EXAMPLES  # noqa: E402

TINY = EXAMPLES / "tiny.yaml"
SHORT = ["--prompt-len", "6", "--new-tokens", "3", "--repeats", "2", "--warmup", "1"]


def test_bound_steps_are_plain_runs(tiny_onnx):
    m = OnnxModel(tiny_onnx, device="cpu", threads=1)
    bound = BoundCache(m)
    ids = np.random.default_rng(0).integers(0, 256, (2, 5))
    mask = np.ones_like(ids)
    mask[1, :2] = 0  # left padding: positions from the mask
    outs = bound.step(bound.inputs(ids, mask), None)
    plain = m.forward(ids, mask)
    np.testing.assert_allclose(outs[0].numpy(), plain["logits"], atol=1e-6, rtol=0)
    for _ in range(3):  # presents bound as the next past, never copied to numpy
        nxt = plain["logits"][:, -1].argmax(-1)[:, None]
        mask = np.concatenate([mask, np.ones_like(nxt)], axis=1)
        outs = bound.step(bound.inputs(nxt, mask), outs)
        plain = m.forward(nxt, mask, past={k: v for k, v in plain.items() if k != "logits"})
        np.testing.assert_allclose(outs[0].numpy(), plain["logits"], atol=1e-6, rtol=0)
    assert outs[1].shape() == [2, 2, 8, 16]  # present.0.key


def test_in_place_cache_steps_equal_plain_runs(tmp_path):
    """`ort`: one buffer per layer's K and V, bound as past and present, appended in place."""
    path = tmp_path / "tiny-ort.onnx"
    export_onnx(build_export_graph(graphllm.load_config(TINY)), path, seed=1, ops="ort")
    m = OnnxModel(path, device="cpu", threads=1)
    p, new = 5, 4
    bound = BoundCache(m, capacity=p + new, batch=2)
    assert bound.in_place and not BoundCache(m).in_place
    ids = np.random.default_rng(0).integers(0, 256, (2, p))
    mask = np.ones_like(ids)
    for _ in range(2):  # a second prefill starts the buffers again from position 0
        outs = bound.step(bound.inputs(ids, mask), None)
        plain = m.forward(ids, mask)
        np.testing.assert_allclose(outs[0].numpy(), plain["logits"], atol=1e-6, rtol=0)
    step_mask = mask
    for _ in range(new - 1):
        nxt = plain["logits"][:, -1].argmax(-1)[:, None]
        step_mask = np.concatenate([step_mask, np.ones_like(nxt)], axis=1)
        outs = bound.step(bound.inputs(nxt, step_mask), outs)
        plain = m.forward(nxt, step_mask, past={k: v for k, v in plain.items() if k != "logits"})
        np.testing.assert_allclose(outs[0].numpy(), plain["logits"], atol=1e-6, rtol=0)
    # the outputs after the logits are the bound buffers, holding the plain run's cache in front
    held = step_mask.shape[1]
    assert outs[1].shape() == [2, 2, p + new, 16]
    np.testing.assert_allclose(
        outs[1].numpy()[:, :, :held], plain["present.0.key"], atol=1e-6, rtol=0
    )


def test_time_generation_counts_repeats_and_steps(tiny_onnx):
    ticks = []
    t = time_generation(OnnxModel(tiny_onnx, "cpu"), 4, 3, repeats=2, warmup=1, tick=ticks.append)
    assert len(t.prefill) == len(t.decode) == 2 and min(t.prefill + t.decode) > 0
    assert ticks == (["prefill"] + ["decode"] * 3) * 3


def test_bench_beside_a_preset_prediction(tiny_onnx):
    r = bench(tiny_onnx, prompt_len=6, new_tokens=3, repeats=2, threads=1, hardware="h100")
    assert (r.model, r.lowering, r.threads) == ("tiny", "ort", 1)
    assert r.provider == "CPUExecutionProvider"
    assert r.hardware == "h100-sxm" and not r.calibrated
    d = r.to_dict()
    assert d["measured"]["decode_ms_per_token"] == pytest.approx(1e3 * r.decode_s)
    assert d["measured"]["tokens_per_second"] == pytest.approx(1 / r.decode_s)
    ratio = d["measured_over_predicted"]
    assert ratio["prefill"] == pytest.approx(r.prefill_s / r.predicted_prefill_s)
    # not a race against the CPU: the tiny model's H100 step is ~45 kernels at 1.3 us each in a
    # CUDA graph (issue 20's launch figure), about what onnxruntime takes on one core
    assert ratio["decode"] == pytest.approx(r.decode_s / r.predicted_decode_s)
    assert r.predicted_decode_s > 45 * 1.3e-6
    assert bench(tiny_onnx, 6, 3, repeats=1, hardware=None).to_dict()["predicted"] is None


def test_bench_calibrates_local_first(tiny_onnx, tmp_path, monkeypatch):
    import graphllm.runtime.calibrate as cal

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    real = cal.calibrate
    sizes = cal.QUICK | {"repeats": 1}
    monkeypatch.setattr(cal, "calibrate", lambda **kw: real(**(kw | sizes)))
    said: list[str] = []
    r = bench(tiny_onnx, 6, 3, repeats=1, hardware="local", say=said.append)
    assert r.calibrated and r.hardware == "local" and r.predicted_decode_s > 0
    assert said and said[0].startswith("no calibration for this machine: calibrating it first")
    assert (tmp_path / "graphllm" / "hardware-local.yaml").is_file()
    said.clear()
    r = bench(tiny_onnx, 6, 3, repeats=1, hardware="local", say=said.append)
    assert not r.calibrated and not said


def test_cli_bench_json_and_text(tiny_onnx):
    r = CliRunner().invoke(main, ["bench", str(tiny_onnx), *SHORT, "--hardware", "h100", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["lowering"] == "ort" and doc["prompt_len"] == 6 and doc["new_tokens"] == 3
    assert (doc["repeats"], doc["warmup"]) == (2, 1)
    assert (
        set(doc["measured"])
        == set(doc["predicted"])
        == {
            "prefill_ms",
            "prefill_tokens_per_second",
            "decode_ms_per_token",
            "tokens_per_second",
        }
    )
    r = CliRunner().invoke(main, ["bench", str(tiny_onnx), *SHORT, "--hardware", "h100"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert "ort lowering" in lines[0] and "median of 2" in lines[0]
    assert "measured/predicted" in lines[1]
    assert [ln.split()[:2] for ln in lines[2:]] == [
        ["prefill", "ms"],
        ["prefill", "tokens/s"],
        ["decode", "ms/token"],
        ["decode", "tokens/s"],
    ]


def test_cli_bench_exports_a_config_first():
    args = ["bench", "--config", str(TINY), "--ops", "ort", *SHORT, "--no-predict", "--json"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["lowering"] == "ort"
    assert r.stderr == ""  # what it did on the way is said to a terminal only


def test_cli_bench_errors_are_one_line(tiny_onnx, tmp_path):
    bare = tmp_path / "bare.onnx"
    onnx.save(onnx.ModelProto(ir_version=8), str(bare))  # an ONNX model, no graphllm metadata
    cases = [
        ([], "give MODEL.onnx"),
        ([str(tiny_onnx), "--model", "llama3-8b"], "give MODEL.onnx"),
        ([str(tiny_onnx), "--ops", "ort"], "--ops, --mla and --mtp choose how a config"),
        ([str(tiny_onnx), "--mla", "absorbed"], "a .onnx file is benched as it was exported"),
        (["--config", str(TINY), "--mtp"], "tiny has no multi-token-prediction layers"),
        ([str(bare)], "no graphllm metadata"),
        ([str(tmp_path / "none.onnx")], "no such ONNX model"),
    ]
    for args, message in cases:
        r = CliRunner().invoke(main, ["bench", *args, "--no-predict"])
        assert r.exit_code == 2, (args, r.output)
        assert r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_cli_stays_light():
    code = (
        "import sys, graphllm.cli, graphllm.runtime\n"
        "heavy = {'onnxruntime', 'torch', 'onnx', 'rich.progress'} & set(sys.modules)\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bench_moves_the_weights_onto_huge_pages_unless_told(tiny_onnx, monkeypatch):
    from graphllm.runtime import hugepages

    calls = []
    monkeypatch.setattr(hugepages, "collapse", lambda: calls.append("collapse") or 0)
    monkeypatch.setattr(hugepages, "huge_bytes", lambda: 123 << 20)
    r = bench(tiny_onnx, 6, 3, repeats=1, hardware=None)
    assert calls == ["collapse"] and r.to_dict()["huge_page_bytes"] == 123 << 20
    args = ["bench", str(tiny_onnx), *SHORT, "--no-predict", "--no-huge-pages", "--json"]
    assert CliRunner().invoke(main, args).exit_code == 0
    assert calls == ["collapse"]


def test_ort_runs_past_max_position_embeddings_as_decomposed_does(tmp_path):
    cfg = graphllm.load_config(TINY)
    ids = np.random.default_rng(2).integers(3, 256, (1, cfg.max_position_embeddings - 4))
    tokens = {}
    for ops in ("ort", "decomposed"):
        export_onnx(build_export_graph(cfg), tmp_path / f"{ops}.onnx", seed=1, ops=ops)
        tokens[ops] = OnnxModel(tmp_path / f"{ops}.onnx", "cpu").generate(ids, 12)
    np.testing.assert_array_equal(tokens["ort"], tokens["decomposed"])  # 8 steps past the end


def test_progress_bar_counts_every_step(tiny_onnx, monkeypatch):
    from rich.progress import Progress

    from graphllm.runtime import bench as bench_mod

    seen: list[tuple[float, float]] = []
    original = Progress.update

    def update(self, task, **kw):
        original(self, task, **kw)
        seen.append((self.tasks[0].completed, self.tasks[0].total))

    monkeypatch.setattr(Progress, "update", update)
    bench(tiny_onnx, 4, 3, repeats=2, warmup=1, hardware=None, progress=True)
    assert seen[-1] == (3 * (1 + 3), 3 * (1 + 3))  # (warm-up + repeats) x (prefill + 3 steps)
    with bench_mod._bar(False, 5) as tick:
        assert tick is None


def test_ort_refuses_a_run_past_its_rotary_tables_in_one_line(tmp_path):
    # the ort lowering reads cos/sin from tables of max_position_embeddings rows (at least
    # 4,096); a run past them is refused before onnxruntime fails inside GroupQueryAttention
    cfg = graphllm.load_config(TINY)
    for ops in ("ort", "standard"):
        export_onnx(build_export_graph(cfg), tmp_path / f"{ops}.onnx", seed=1, ops=ops)
    ort_model = OnnxModel(tmp_path / "ort.onnx", "cpu")
    assert OnnxModel(tmp_path / "standard.onnx", "cpu").max_positions is None
    rows = ort_model.max_positions
    assert rows == max(cfg.max_position_embeddings, 4096)
    ids = np.zeros((1, 8), np.int64)
    for run in (
        lambda: ort_model.generate(ids, rows - 7),
        lambda: ort_model.forward(ids, past=_past(ort_model, rows - 7)),
        lambda: bench(tmp_path / "ort.onnx", rows - 60, 61, repeats=1, hardware=None),
    ):
        with pytest.raises(GraphllmError, match=rf"spans {rows + 1:,} positions, past the") as e:
            run()
        assert "\n" not in str(e.value)
    assert ort_model.generate(ids, 2).shape == (1, 2)


def _past(model: OnnxModel, n: int) -> dict[str, np.ndarray]:
    """A past of n positions, for each of the model's cache inputs (zeros)."""
    return {k: np.zeros((1, v.shape[1], n, v.shape[3]), np.float32) for k, v in model._past.items()}
