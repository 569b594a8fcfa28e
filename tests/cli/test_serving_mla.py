"""`graphllm serving` and `graphllm plan` price an MLA model's decode as engines run it: absorbed
(attention over the cached latent), not re-expanding every past key and value each step, and
say so; `--mla` overrides it as in `partition`, and a model without MLA is refused 'absorbed'."""

import json

import pytest
from click.testing import CliRunner

from graphllm.cli.main import main
from graphllm.models.config import load_config
from graphllm.models.hardware import load_hardware
from graphllm.models.workload import Workload
from graphllm.passes.parallel.engine import mla_form
from graphllm.passes.parallel.partition import Strategy
from graphllm.report.serving_steps import programs

# the user's command: DeepSeek-V3 on 8 H200 at concurrency 64, 1k tokens in and 1k out, where
# TensorRT-LLM measured about 34 ms a token (InferenceX); naive decode priced it at 768 ms
COMMAND = ["--model", "deepseek-v3", "--tp", "8", "--hardware", "h200", "-b", "64"]
REQUESTS = ["--prompt-len", "1024", "--output-len", "1024"]


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def served():
    r = _invoke("serving", *COMMAND, *REQUESTS)
    assert r.exit_code == 0, r.output
    return r.output


@pytest.fixture(scope="module")
def doc():
    r = _invoke("serving", *COMMAND, *REQUESTS, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_serving_decode_is_partitions_absorbed_step(doc):
    """A decode step at the mean context (1024 + 512 past) is partition --mla absorbed's step,
    and the time per output token that step plus its share of prefill: within 1.5x of it,
    where the naive form was 20x."""
    config, hw = load_config("deepseek-v3"), load_hardware("h200")
    step = Workload(batch=64, seq_len=1, past_len=1536, logits="last")
    stages = programs(config, step, Strategy(tp=8), hw, "flash", "absorbed")[1]
    absorbed = sum(st["seconds"] for st in stages)
    assert doc["stages"][0]["decode_seconds"] == pytest.approx(absorbed, rel=1e-9)
    assert doc["tpot_seconds"] < 1.5 * absorbed
    assert 0.025 < doc["tpot_seconds"] < 0.05  # the measured 34 ms, within the model's error
    assert doc["mla"]["prefill"] == "naive" and doc["mla"]["decode"] == "absorbed"


def test_serving_says_which_form_each_phase_uses(served):
    line = next(x for x in served.splitlines() if x.startswith("MLA: "))
    assert "naive for prefill, absorbed for decode" in line and "vLLM" in line


def test_mla_naive_is_the_old_figure_and_slower(doc):
    """--mla naive prices decode re-expanding the latent: what serving gave before, many times
    the absorbed step."""
    r = _invoke("serving", *COMMAND, "-b", "8", *REQUESTS, "--json", "--mla", "naive")
    assert r.exit_code == 0, r.output
    naive = json.loads(r.output)
    assert naive["mla"] == {"prefill": "naive", "decode": "naive", "why": "--mla naive"}
    at_8 = next(p for p in doc["curve"] if p["batch"] == 8)
    assert naive["tpot_seconds"] > 3 * at_8["tpot_seconds"]


def test_plan_prices_a_decode_step_absorbed():
    args = ["plan", "--model", "deepseek-v3", "-n", "8", "--hardware", "h200", "--tp", "8"]
    r = _invoke(*args, "-b", "64", "--seq-len", "1", "--past-len", "1536", "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert plan["mla"]["form"] == "absorbed"
    assert plan["plan"]["candidates"][0]["seconds"] < 0.05  # naive: some 0.7 s


def test_auto_form_by_phase():
    v3, llama = load_config("deepseek-v3"), load_config("llama3-8b")
    assert [mla_form(v3, p) for p in ("prefill", "decode", "training")] == [
        "naive",
        "absorbed",
        "naive",
    ]
    assert mla_form(llama, "decode") == "naive"  # no latent attention: nothing to absorb
    assert mla_form(v3, "decode", "naive") == "naive"


def test_absorbed_on_a_model_without_mla_is_one_line():
    r = _invoke("serving", "--model", "llama3-8b", "--mla", "absorbed", "-b", "1")
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "no latent attention" in lines[0], r.output


def test_a_model_without_mla_has_no_mla_line():
    r = _invoke("serving", "--model", "llama3-8b", "-b", "1", "--output-len", "16")
    assert r.exit_code == 0, r.output
    assert "MLA:" not in r.output


def test_partition_prices_and_names_the_engines_form_by_default():
    step = [*COMMAND, "--past-len", "1024", "-t", "1", "--json"]
    docs = {}
    for form in ("auto", "naive", "absorbed"):
        r = _invoke("partition", *step, "--mla", form)
        assert r.exit_code == 0, r.output
        docs[form] = json.loads(r.output)
    assert docs["auto"]["mla"]["form"] == "absorbed" and docs["naive"]["mla"]["form"] == "naive"
    assert docs["auto"]["partition"] == docs["absorbed"]["partition"] != docs["naive"]["partition"]
    assert "engines" not in docs["naive"]["mla"]["why"]  # the flag, not the engines' choice
    r = _invoke("partition", *COMMAND[:2], "-t", "64")
    assert "MLA: naive for this prefill step" in r.output
    r = _invoke("partition", "--model", "llama3-8b", "--tp", "2", "--json")
    assert "mla" not in json.loads(r.output)
