"""`graphllm verify tokens`: the T it runs at when nothing gives one; `verify partition` of a
published model on its small instance."""

import json
import time

import pytest
from click.testing import CliRunner

from graphllm.cli import main
from tests.support.paths import EXAMPLES

TINY_HF = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "max_position_embeddings": 512,
}


def test_config_without_workload_runs_at_a_small_t_and_says_so(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY_HF))
    r = CliRunner().invoke(main, ["verify", "tokens", "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    assert "T=12: predicted == observed on 144 cells" in r.stdout
    assert "uses T=12" in r.stderr and "-t" in r.stderr
    # a preset has no workload either: said the same way; the past, where given, is named
    r = CliRunner().invoke(main, ["verify", "tokens", "--model", "llama3-8b", "--past-len", "4"])
    assert r.exit_code == 0, r.output
    assert "T=12 P=4: predicted == observed" in r.stdout
    assert "the preset gives no seq_len; verify tokens uses T=12" in r.stderr


def test_a_config_that_does_not_load_is_its_error_alone(tmp_path):
    r = CliRunner().invoke(main, ["verify", "tokens", "--config", str(tmp_path / "none.json")])
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and r.output.startswith("error: "), r.output


def test_workload_section_and_flag_win_silently():
    r = CliRunner().invoke(main, ["verify", "tokens", "--config", str(EXAMPLES / "article.yaml")])
    assert r.exit_code == 0 and "T=3" in r.stdout and r.stderr == ""
    r = CliRunner().invoke(
        main, ["verify", "tokens", "--config", str(EXAMPLES / "tiny.yaml"), "-t", "5"]
    )
    assert r.exit_code == 0 and "T=5" in r.stdout and r.stderr == ""


def test_t_over_the_limit_is_refused_in_one_line():
    r = CliRunner().invoke(
        main, ["verify", "tokens", "--config", str(EXAMPLES / "tiny.yaml"), "-t", "300"]
    )
    assert r.exit_code == 2 and "T=300 is over 256" in r.stderr


# the small instance a published model is verified on takes the splits the model takes
@pytest.mark.parametrize(
    "args",
    [
        ["--model", "llama3-70b", "--tp", "8", "-t", "12"],
        ["--model", "llama3-70b", "--tp", "8"],  # no -t: a short prompt, said in the note
        ["--model", "deepseek-v3", "--tp", "8", "--ep", "16", "-t", "16"],
        ["--model", "llama3-70b", "--pp", "8", "-t", "12"],
    ],
)
def test_verify_partition_of_a_published_model_at_its_splits(args):
    start = time.perf_counter()
    r = CliRunner().invoke(main, ["verify", "partition", *args])
    assert r.exit_code == 0, r.output
    assert "(small instance)" in r.stdout and "logits equal within 1e-5" in r.stdout
    # a toy instance: seconds; the full model would take hours (generous for a loaded CI machine)
    assert time.perf_counter() - start < 120
    assert ("at T=12 (-t to choose)" in r.stderr) == ("-t" not in args)


# without -t and -b the instance's prompt and batch are ones its cuts divide (a prompt of 12
# was refused: "--ep 8 divides neither the batch 1 nor the 12 tokens")
@pytest.mark.parametrize(
    ("args", "note"),
    [
        (["--model", "deepseek-v3", "--tp", "8", "--ep", "8"], "at T=16 (-t to choose)"),
        (["--model", "qwen3-30b-a3b", "--ep", "16"], "at T=16 (-t to choose)"),
        (["--model", "llama3-8b", "--cp", "8"], "at T=16 (-t to choose)"),
        (["--model", "llama3-8b", "--dp", "8"], "at T=12 (-t to choose), B=8 (-b to choose)"),
        (["--model", "llama3-8b", "--pp", "2", "--microbatches", "4"], "B=4 (-b to choose)"),
    ],
)
def test_verify_partition_picks_sizes_its_cuts_divide(args, note):
    r = CliRunner().invoke(main, ["verify", "partition", *args])
    assert r.exit_code == 0, r.output
    assert note in r.stderr and "logits equal within 1e-5" in r.stdout


def test_verify_partition_takes_t_from_the_configs_workload_section(tmp_path):
    # over 200M parameters, so a small instance runs, at the file's T rather than the short one
    cfg = tmp_path / "big.yaml"
    big = TINY_HF | {"hidden_size": 2048, "intermediate_size": 8192, "vocab_size": 32000}
    body = "".join(f"{k}: {v}\n" for k, v in big.items())
    cfg.write_text(body + "workload:\n  seq_len: 16\n")
    r = CliRunner().invoke(main, ["verify", "partition", "--config", str(cfg), "--tp", "2"])
    assert r.exit_code == 0, r.output
    assert "(small instance)" in r.stdout and "T=16 P=0" in r.stdout
    assert "too many to run every rank" in r.stderr and "at T=12" not in r.stderr
    cfg.write_text(body)  # no T anywhere: the short prompt, said
    r = CliRunner().invoke(main, ["verify", "partition", "--config", str(cfg), "--tp", "2"])
    assert r.exit_code == 0, r.output
    assert "T=12 P=0" in r.stdout and "at T=12 (-t to choose)" in r.stderr
