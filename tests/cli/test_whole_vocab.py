"""--whole-vocab (issue 20): tp leaves the embedding and the LM head whole on every rank, as
gpt-fast's tp.py does; the flag reaches the partition and the serving figures."""

import json

from click.testing import CliRunner

from graphllm.cli import main as cli

ARGS = ["--model", "llama3-8b", "--tp", "8", "-t", "1", "--past-len", "207", "--hardware", "a100"]


def _partition(*extra: str) -> dict:
    r = CliRunner().invoke(cli, ["partition", *ARGS, *extra, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_whole_vocab_keeps_both_vocabulary_tensors_on_every_rank():
    split, whole = _partition(), _partition("--whole-vocab")
    assert whole["partition"]["strategy"]["whole_vocab"] is True
    assert "whole_vocab" not in split["partition"]["strategy"]
    vocab, hidden = 128256, 4096  # llama3-8b: embedding and LM head, 7/8 of each more a rank

    def params(doc: dict) -> int:
        return doc["partition"]["devices"][0]["params"]

    assert params(whole) - params(split) == 2 * vocab * hidden * 7 // 8


def test_the_headline_says_the_vocabulary_is_whole():
    r = CliRunner().invoke(cli, ["partition", *ARGS, "--whole-vocab"])
    headline = " ".join(r.output.split("┏")[0].split())  # the runner's console wraps at 80
    assert r.exit_code == 0 and headline.endswith("(tp=8, embedding and LM head whole)")


def test_serving_takes_it_and_says_so():
    args = ["serving", "--model", "llama3-8b", "--tp", "8", "--whole-vocab", "--hardware", "a100"]
    r = CliRunner().invoke(cli, [*args, "--prompt-len", "128", "--output-len", "16"])
    assert r.exit_code == 0, r.output
    assert "tp=8 whole_vocab" in r.output.splitlines()[0]


def test_without_tp_it_is_refused_in_one_line():
    r = CliRunner().invoke(cli, ["partition", "--model", "llama3-8b", "--whole-vocab"])
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [
        "error: --whole-vocab keeps the vocabulary whole across --tp ranks: add --tp"
    ]
