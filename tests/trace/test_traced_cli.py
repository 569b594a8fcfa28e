"""`graphllm trace` on a model graphllm builds no family for, and the frontend choices."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("transformers")
from graphllm.cli.main import main
from graphllm.models.workload import Workload
from graphllm.report.html import report_data
from graphllm.trace import traced_graph
from tests.support.traced import FAMILIES


def _write(tmp_path, raw):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    return str(path)


def test_a_model_type_without_a_family_is_traced(tmp_path):
    path = _write(tmp_path, FAMILIES["layernorm_bias"])
    r = CliRunner().invoke(main, ["trace", "--config", path, "-t", "16", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["model"]["frontend"] == "traced" and doc["model"]["model_type"] == "starcoder2"
    assert doc["token_mixing"]["mixing_ops"] == ["pv", "scores", "softmax"]
    text = CliRunner().invoke(main, ["trace", "--config", path, "-t", "16"]).output
    assert "frontend: traced from transformers' modeling code" in text


def test_traced_and_built_llama_agree(tmp_path):
    path = _write(tmp_path, FAMILIES["dense"])
    docs = {}
    for frontend in ("built", "traced"):
        args = ["trace", "--config", path, "-t", "16", "--past-len", "8", "--json"]
        r = CliRunner().invoke(main, [*args, "--frontend", frontend])
        assert r.exit_code == 0, r.output
        docs[frontend] = json.loads(r.output)
    built, traced = docs["built"], docs["traced"]
    assert built["model"]["frontend"] == "built"
    assert traced["params"]["total"] == built["params"]["total"]
    assert traced["flops"]["matmul"] == built["flops"]["matmul"]
    assert traced["flops"]["matmul_causal"] == built["flops"]["matmul_causal"]
    for key in ("weights", "kv_cache"):
        assert traced["memory"][key] == built["memory"][key], key


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"model_type": "my_llm", "auto_map": {"AutoModel": "x.Y"}}, "never runs code"),
        ({"model_type": "no_such_model"}, "unknown model_type 'no_such_model'"),
        (dict(FAMILIES["dense"], model_type="bert"), "is an encoder"),
        (dict(FAMILIES["dense"], model_type="t5"), "not a causal language model"),
        ({"model_type": "gpt2", "n_embd": 64}, "'vocab_size', 'num_hidden_layers'"),
    ],
)
def test_refusals_are_one_line(tmp_path, raw, says):
    r = CliRunner().invoke(
        main, ["trace", "--config", _write(tmp_path, raw), "--frontend", "traced"]
    )
    assert r.exit_code == 2, r.output
    assert says in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("view", ["model", "block", "attention", "ffn", "tokens"])
def test_render_draws_a_traced_model(tmp_path, view):
    path = _write(tmp_path, FAMILIES["moe"])
    out = tmp_path / f"{view}.dot"
    r = CliRunner().invoke(main, ["render", "--config", path, "--view", view, "-o", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "model.layers.0" in text or view in ("model", "tokens")
    if view == "block":  # the block reads like a built one's: attention mixing, the MoE
        assert "mixes tokens" in text and "experts" in text


@pytest.mark.parametrize("kind", ["moe", "sliding"])
def test_verify_tokens_observes_what_the_traced_graph_predicts(tmp_path, kind):
    path = _write(tmp_path, FAMILIES[kind])
    for extra in ([], ["--past-len", "4"]):
        args = ["verify", "tokens", "--config", path, "--frontend", "traced", "--full-size"]
        args += ["-t", "6", *extra]
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
        assert "predicted == observed on 36 cells" in r.output
    args = ["verify", "tokens", "--config", path, "--frontend", "traced", "-t", "6"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and "--full-size" in r.output


def test_report_of_a_traced_model(tmp_path):
    path = _write(tmp_path, FAMILIES["moe"])
    out = tmp_path / "r.html"
    args = ["report", "--config", path, "--frontend", "traced", "-t", "16", "--sweep", "4,16"]
    r = CliRunner().invoke(main, [*args, "--hardware", "h100", "--ep", "2", "-o", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text(encoding="utf-8")
    assert "all_to_all" in text and "block-0" in text
    # the op table: each op of the first layer of its kind, standing for both layers
    config = traced_graph(FAMILIES["moe"], Workload()).meta["config"]
    rows = report_data(config, Workload(seq_len=16), sweep_lens=[4])["ops"]["rows"]
    layers = {r[0]: r[4] for r in rows}
    assert layers["model.layers.0.mlp.experts.dispatch"] == 2
    assert not any(name.startswith("model.layers.1.") for name in layers)
    assert layers["lm_head"] == 1


def test_traced_latent_attention_decode_is_not_naive_unasked(tmp_path):
    path = _write(tmp_path, FAMILIES["mla"])
    args = ["trace", "--config", path, "--frontend", "traced", "-t", "1", "--past-len", "8"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and "give --mla naive" in r.output
    r = CliRunner().invoke(main, [*args, "--mla", "naive", "--json"])
    assert r.exit_code == 0, r.output
    assert CliRunner().invoke(main, args[:-2] + ["--past-len", "0"]).exit_code == 0


def test_a_seq_len_list_sweeps_a_traced_model(tmp_path):
    path = _write(tmp_path, FAMILIES["dense"])
    rows = {}
    for frontend in ("built", "traced"):
        args = ["trace", "--config", path, "--seq-len", "8,32", "--json", "--frontend", frontend]
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
        rows[frontend] = json.loads(r.output)["sweep"]
    assert [r["seq_len"] for r in rows["traced"]] == [8, 32]
    assert [r["matmul"] for r in rows["traced"]] == [r["matmul"] for r in rows["built"]]


def test_a_traced_hybrids_state_is_not_set_against_an_unknown_full_attention(tmp_path):
    # a traced model's recurrent layers have no K/V shape of the model's to price as full
    # attention: the state line gives the state and the cache, not a comparison with 0 B
    traced = ["--config", _write(tmp_path, FAMILIES["mamba2"]), "--frontend", "traced"]
    for args, compared in ((traced, False), (["--model", "nemotron-h-8b"], True)):
        r = CliRunner().invoke(main, ["trace", *args, "-t", "16"])
        assert r.exit_code == 0, r.output
        text = " ".join(r.output.split())  # the console wraps at its width
        assert "state (conv and recurrent" in text
        assert ("with full attention on every layer" in text) == compared
