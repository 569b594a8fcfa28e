"""`--mtp` on the command line: DeepSeek-V3's MTP modules in trace, one-line errors elsewhere."""

import json

import pytest
from click.testing import CliRunner

from graphllm.cli import main


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_trace_reports_the_mtp_modules_on_their_own_line():
    r = invoke("trace", "--model", "deepseek-v3", "-t", "4", "--mtp", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["workload"]["mtp"] is True
    assert doc["params"]["mtp"] == 13_463_426_304
    assert doc["params"]["total"] - doc["params"]["mtp"] == 671_026_419_200
    assert doc["flops"]["by_scope"]["mtp"] > 0
    assert {"mtp.1.input_ids"} <= set(doc["graph"]["inputs"])
    assert {"mtp.1.logits", "present.61.key"} <= set(doc["graph"]["outputs"])
    text = invoke("trace", "--model", "deepseek-v3", "-t", "4", "--mtp").stdout
    assert "MTP modules" in text and "13,463,426,304" in text


@pytest.mark.parametrize(
    ("command", "model", "message"),
    [
        (
            "trace",
            "deepseek-v2-lite",
            "(deepseek_v2 has none; DeepSeek-V3, Kimi-K2 and GLM-4.5 have them)",
        ),
        ("trace", "llama3-8b", "llama3-8b has no multi-token-prediction layers"),
        ("partition", "mixtral-8x7b", "mixtral-8x7b has no multi-token-prediction layers"),
    ],
)
def test_mtp_without_mtp_layers_is_one_line_exit_2(command, model, message):
    r = invoke(command, "--model", model, "-t", "4", "--mtp")
    assert r.exit_code == 2
    assert r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
