"""The command line: summaries, JSON documents, and one-line errors with exit code 2."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from graphllm.cli import main
from graphllm.passes.params import KINDS
from tests.support.paths import EXAMPLES


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_trace_json_document():
    r = invoke("trace", "--model", "llama3-8b", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["model"]["name"] == "llama3-8b"
    assert doc["workload"] == doc["workload"] | {"batch": 1, "seq_len": 2048, "past_len": 0}
    assert doc["graph"]["nodes"] > 32 * 20 and doc["graph"]["edges"] > doc["graph"]["nodes"]
    p = doc["params"]
    assert p["total"] == p["active"] == 8_030_261_248
    assert tuple(p["by_kind"]) == KINDS  # every kind, in order, a dense model's zeros too
    assert sum(p["by_kind"].values()) == p["total"]
    tm = doc["token_mixing"]
    assert {n["op"] for n in tm["nodes"]} == {"scores", "softmax", "pv"}
    assert tm["receptive_field"] == 2048 and len(tm["per_layer"]) == 32


def test_trace_readable_summary_and_workload_flags():
    r = invoke(
        "trace",
        "--config",
        str(EXAMPLES / "mixtral.yaml"),
        "-t",
        "7",
        "--past-len",
        "3",
        "--dtype",
        "int4",
    )
    assert r.exit_code == 0, r.output
    out = " ".join(r.stdout.split())
    assert "decode, B=1 T=7 P=3 (S=10)" in out
    assert "weights int4, activations fp16" in out
    assert "46,702,792,704" in out and "moe_experts" in out
    assert "ops: pv, scores, softmax" in out


def test_trace_yaml_workload_section_and_flag_override():
    r = invoke("trace", "--config", str(EXAMPLES / "article.yaml"), "--json")
    doc = json.loads(r.stdout)
    assert doc["workload"]["seq_len"] == 3
    r = invoke("trace", "--config", str(EXAMPLES / "article.yaml"), "--json", "-t", "5")
    assert json.loads(r.stdout)["workload"]["seq_len"] == 5


def test_print_graph():
    r = invoke("trace", "--config", str(EXAMPLES / "article.yaml"), "--print-graph")
    assert "%model.layers.0.self_attn.core.scores : B×2×T×T = scores(" in r.stdout


def test_presets_lists_the_required_models():
    r = invoke("presets", "--json")
    names = {p["name"] for p in json.loads(r.stdout)}
    assert {
        "llama2-7b",
        "llama3-8b",
        "llama3-70b",
        "llama3.1-405b",
        "llama3.2-1b",
        "mistral-7b",
        "mixtral-8x7b",
        "qwen2-7b",
        "qwen1.5-moe-a2.7b",
        "qwen3-30b-a3b",
        "gemma-2b",
        "phi3-mini",
        "olmo2-7b",  # issue 16
        "command-r-35b",  # issue 16
        "command-r7b",  # issue 16
        "gemma2-9b",  # issue 16
        "gemma3-1b",  # issue 16
        "gemma3-27b",  # issue 16
    } <= names


def test_verify_tokens_agrees():
    r = invoke("verify", "tokens", "--config", str(EXAMPLES / "qwen-moe.yaml"), "-t", "8")
    assert r.exit_code == 0, r.output
    assert "predicted == observed on 64 cells" in r.stdout


BAD = [
    (["--config", "nope/config.json"], "no such file"),
    (["--model", "llama9-8b"], "unknown preset"),
    (["--model", "llama3-8b", "--config", "x.yaml"], "exactly one of"),
    ([], "exactly one of"),
]


@pytest.mark.parametrize(("args", "message"), BAD)
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = invoke("trace", *args)
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model_type: llama\nhidden_size: [1, 2\n", "yaml"),
        ("model_type: llama\nhidden_size: 64\nnum_attention_head: 4\n", "num_attention_heads"),
        ("model_type: deepseek_v3\n", "deepseek_v3"),
        ("model_type: gpt2\n", "gpt2"),
    ],
)
def test_bad_yaml_files(tmp_path, text, message):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    r = invoke("trace", "--config", str(f))
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0].lower(), r.stderr


def test_real_process_has_no_traceback(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("model_type: llama\nhidden_size: 60\nnum_attention_heads: 7\n")
    p = subprocess.run(
        [sys.executable, "-m", "graphllm.cli", "trace", "--config", str(f)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_trace_costs_in_json_and_summary():
    r = invoke("trace", "--model", "llama3-8b", "--json")
    doc = json.loads(r.stdout)
    assert doc["flops"]["matmul"] == 32_938_104_193_024
    assert set(doc["flops"]) >= {"total", "matmul", "matmul_causal", "by_scope", "by_op"}
    assert set(doc["bytes"]) >= {"total", "weights", "kv_cache", "activations"}
    assert set(doc["memory"]) >= {"weights", "kv_cache", "activations"}
    assert doc["roofline"]["hardware"] == "h100-sxm" and doc["roofline"]["prefill_ms"] > 0
    r = invoke("trace", "--model", "llama3-70b", "-t", "1", "--past-len", "16", "--training",
               "--attention", "naive", "--logits", "last", "--hardware", "a100")  # fmt: skip
    assert r.exit_code == 0, r.output
    out = " ".join(r.stdout.split())
    assert "forward + backward" in out and "naive attention" in out
    assert "ms per token" in out and "a100" in out


def test_per_op_table_is_written_whole(tmp_path):
    f = tmp_path / "ops.csv"
    r = invoke("trace", "--config", str(EXAMPLES / "tiny.yaml"), "--per-op", "csv", str(f))
    assert r.exit_code == 0, r.output
    lines = f.read_text().splitlines()
    assert lines[0].startswith("name,op,scopes,outputs,flops,matmul")
    assert any(line.startswith("model.layers.0.self_attn.core.scores,scores,") for line in lines)
    j = tmp_path / "ops.json"
    invoke("trace", "--config", str(EXAMPLES / "tiny.yaml"), "--per-op", "json", str(j))
    rows = json.loads(j.read_text())
    assert {"name", "flops", "bytes_read", "seconds", "bound"} <= set(rows[0])
    bad = tmp_path / "missing" / "ops.csv"
    r = invoke("trace", "--config", str(EXAMPLES / "tiny.yaml"), "--per-op", "csv", str(bad))
    assert r.exit_code == 2 and not bad.exists()
    assert list(tmp_path.iterdir()) == [f, j]  # no temporary file left behind


def test_sweep_prints_growth_and_plots(tmp_path):
    png = tmp_path / "sweep.png"
    r = invoke("trace", "--model", "llama3-8b", "-t", "128,1024,8192", "--plot", str(png))
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the sweep says which model produced its times, and where its plot went
    assert r.output.startswith("llama3-8b on h100-sxm\n")
    assert "times: achievable model" in r.output and f"wrote {png}" in r.output
    r = invoke("trace", "--model", "llama3-8b", "-t", "128,256", "--json")
    doc = json.loads(r.stdout)
    rows = doc["sweep"]
    assert [x["seq_len"] for x in rows] == [128, 256]
    assert rows[1]["flops"] > 2 * rows[0]["flops"] * 0.99
    assert (doc["hardware"], doc["rate_model"]) == ("h100-sxm", "achievable")
    ideal = json.loads(
        invoke("trace", "--model", "llama3-8b", "-t", "1,2", "--ideal", "--json").stdout
    )
    assert ideal["rate_model"] == "ideal" and ideal["sweep"][0]["rate_model"] == "ideal"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hardware", "tpu-v9"], "unknown hardware"),
        (["--plot", "x.png"], "--plot draws a sweep"),
        (["-t", "0"], "positive"),
    ],
)
def test_cost_option_errors(args, message, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    r = invoke("trace", "--model", "llama3-8b", *args)
    assert r.exit_code == 2
    assert message in r.stderr, r.stderr


def test_hardware_local_without_calibration(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    r = invoke("trace", "--model", "llama3-8b", "--hardware", "local")
    assert r.exit_code == 2 and "graphllm calibrate" in r.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-t", "4,8", "--plot", "p.txt"], "give a .png, .svg or .pdf"),
        (["--per-op", "csv", "."], "not an empty one or a folder"),
        (["--per-op", "csv", "/proc/nope/x.csv"], "does not exist"),
    ],
)
def test_output_path_errors_are_one_line(args, message):
    r = invoke("trace", "--config", str(EXAMPLES / "tiny.yaml"), *args)
    assert r.exit_code == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_written_files_have_a_normal_mode(tmp_path):
    f = tmp_path / "ops.csv"
    invoke("trace", "--config", str(EXAMPLES / "tiny.yaml"), "--per-op", "csv", str(f))
    assert f.stat().st_mode & 0o044 == 0o044  # readable by group and others (umask 022)


def test_verify_tokens_uses_the_workload():
    r = invoke(
        "verify", "tokens", "--model", "mistral-7b", "--past-len", "20", "-t", "4", "-b", "2"
    )
    assert r.exit_code == 0 and "T=4" in r.stdout and "16 cells" in r.stdout
    r = invoke("verify", "tokens", "--config", str(EXAMPLES / "article.yaml"))
    assert "T=3" in r.stdout and "9 cells" in r.stdout


def test_trace_mla_forms():
    docs = {}
    for form in ("naive", "absorbed"):
        r = invoke("trace", "--model", "deepseek-v3", "-t", "1", "--past-len", "4096", "--mla", form,
                   "--json")  # fmt: skip
        assert r.exit_code == 0, r.output
        docs[form] = json.loads(r.stdout)
    assert docs["absorbed"]["workload"]["mla"] == "absorbed"
    assert docs["naive"]["params"] == docs["absorbed"]["params"]
    # folding the up projections removes the per-step re-expansion of the cached latent
    assert docs["absorbed"]["flops"]["total"] < docs["naive"]["flops"]["total"] / 10
    assert docs["naive"]["memory"]["kv_cache"] == docs["absorbed"]["memory"]["kv_cache"]
    # by default each step in the form engines run it: a decode step absorbed, a prefill naive
    r = invoke("trace", "--model", "deepseek-v3", "-t", "1", "--past-len", "4096", "--json")
    assert json.loads(r.stdout)["flops"] == docs["absorbed"]["flops"]
    assert json.loads(r.stdout)["workload"]["mla"] == "absorbed"
    r = invoke("trace", "--model", "deepseek-v2-lite", "-t", "64", "--json")
    assert json.loads(r.stdout)["workload"]["mla"] == "naive"
    r = invoke("trace", "--model", "deepseek-v3", "-t", "1", "--past-len", "4096")
    assert "(shown above: --mla absorbed)" in r.stdout


def test_usage_errors_and_options_a_model_lacks_are_one_line():
    cases = [
        (["trace", "--model", "deepseek-v3", "--mla", "bogus"], "Invalid value for '--mla'"),
        (["trace", "--model", "llama3-8b", "--bogus"], "No such option '--bogus'"),
        (["bench", "--prompt-len", "0", "m.onnx"], "Invalid value for '--prompt-len'"),
        (["nosuch"], "No such command 'nosuch'"),
        (["render", "--model", "llama3-8b"], "Missing option '--view'. Choose from: model, block,"),
        (
            ["trace", "--model", "llama3-8b", "--mla", "absorbed"],
            "llama3-8b has no latent attention",
        ),
    ]
    for args, message in cases:
        r = invoke(*args)
        assert r.exit_code == 2, (args, r.output)
        assert r.stderr.count("\n") == 1 and message in r.stderr, (args, r.stderr)
        assert r.stderr.startswith("error: ") and not r.stdout
