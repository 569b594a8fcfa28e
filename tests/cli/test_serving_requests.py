"""`graphllm serving`'s request shape: what a server refuses is one line and exit 2 (a request past
the model's context, an output of one token, every position's logits), `--microbatches 1` with
`--pp` keeps one microbatch in flight, and a config's workload section is said to be unused."""

import json

import pytest
from click.testing import CliRunner

from graphllm.cli.main import main
from graphllm.models.config import load_config
from graphllm.models.hardware import load_hardware
from graphllm.models.workload import Workload
from graphllm.passes.parallel.partition import Strategy
from graphllm.report.serving import serving_report
from graphllm.report.serving_steps import decode_stages


def _serving(*args: str):
    return CliRunner().invoke(main, ["serving", *args])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["--prompt-len", "8000", "--output-len", "193"],
            "8,193 tokens, past llama3-8b's context of 8,192",
        ),
        (["--prompt-len", "16777216"], "context of 8,192 (max_position_embeddings)"),
        (["--output-len", "1"], "no decode step"),
        (["--logits", "all"], "drop --logits all"),
    ],
)
def test_what_a_server_refuses_is_one_line(args, says):
    r = _serving("--model", "llama3-8b", *args)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], r.output


def test_a_request_filling_the_context_is_served():
    r = _serving("--model", "llama3-8b", "--prompt-len", "8000", "--output-len", "192", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["prompt"] + json.loads(r.output)["output"] == 8192


def test_one_microbatch_in_flight_leaves_the_other_stages_idle():
    """--microbatches 1 with --pp 4: the whole batch laps the four stages, a token every sum of
    their steps; the default keeps pp microbatches in flight, a quarter of the batch each."""
    cfg, hw = load_config("llama3-8b"), load_hardware("h100")
    one = serving_report(
        cfg, Workload(), Strategy(pp=4), hw, prompt=512, output=64, batch=8, microbatches_given=True
    )
    four = serving_report(cfg, Workload(), Strategy(pp=4), hw, prompt=512, output=64, batch=8)
    assert (one["microbatches_in_flight"], four["microbatches_in_flight"]) == (1, 4)
    prefill_turn = max(s["prefill_seconds"] for s in one["stages"])
    steps = [
        s["seconds"]
        for s in decode_stages(
            cfg, Workload(batch=8, logits="last"), Strategy(pp=4), hw, "flash", 512 + 33
        )
    ]
    assert one["tpot_seconds"] == pytest.approx(sum(steps) + 8 / 64 * prefill_turn)
    # the command: given explicitly, 1 is one microbatch, not the default's pp
    flags = ["--model", "llama3-8b", "--pp", "4", "-b", "8", "--prompt-len", "512"]
    r = _serving(*flags, "--output-len", "64", "--microbatches", "1", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["microbatches_in_flight"] == 1 and doc["tpot_seconds"] == one["tpot_seconds"]


def test_a_workload_section_is_said_to_be_unused(tmp_path):
    r = CliRunner().invoke(main, ["serving", "--config", "examples/qwen-moe.yaml", "--json"])
    assert r.exit_code == 0, r.output
    note = "examples/qwen-moe.yaml's workload batch, seq_len, past_len are not used"
    assert note in r.stderr
    doc = json.loads(r.stdout)
    assert doc["batch"] == doc["max_batch"]  # the section's batch of 4 is not the request's
