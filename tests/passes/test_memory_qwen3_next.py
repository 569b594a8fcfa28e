"""issue 19: the cache of Qwen3-Next is state, not keys: each Gated DeltaNet layer carries its
conv state (the last K-1 inputs) and its recurrent state (fp32), constant in the sequence length,
beside the KV cache of the attention layers; `trace` sets both against full attention on every
layer at the same length."""

import pytest
from click.testing import CliRunner

from graphllm import Workload, build_graph, load_config
from graphllm.cli import main
from graphllm.passes import run

LINEAR, FULL = 36, 12
CONV = 3 * (2 * 16 * 128 + 32 * 128) * 2  # K-1 inputs of the q|k|v channels, bf16
RECURRENT = 32 * 128 * 128 * 4  # value heads x d_k x d_v, fp32


@pytest.mark.parametrize("seq_len", [16, 4096])
def test_state_bytes_are_constant_in_the_sequence_length(seq_len):
    g = build_graph(load_config("qwen3-next-80b-a3b"), Workload(seq_len=seq_len))
    m = run(g, ["memory"])["memory"]
    assert m.state == LINEAR * (CONV + RECURRENT)
    kv_per_layer = 2 * seq_len * 2 * 256 * 2  # K and V, 2 kv heads of 256, bf16
    assert m.kv_cache == FULL * kv_per_layer
    assert m.kv_cache_full == (LINEAR + FULL) * kv_per_layer
    assert m.total == m.weights + m.kv_cache + m.state + m.activations


def test_a_decode_step_carries_the_same_state():
    g = build_graph(load_config("qwen3-next-80b-a3b"), Workload(seq_len=1, past_len=8000))
    assert run(g, ["memory"])["memory"].state == LINEAR * (CONV + RECURRENT)


def test_trace_sets_the_cache_against_full_attention():
    args = ["trace", "--model", "qwen3-next-80b-a3b", "-t", "1", "--past-len", "32767"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "state (conv and recurrent, constant in the sequence length) 77.27 MB" in text
    # 12 attention layers of 32,768 positions (805.31 MB) and the states, against 48 layers
    assert "KV cache 805.31 MB" in text
    expect = "KV cache + state 882.57 MB, against 3.22 GB with full attention on every layer"
    assert f"{expect}: 73% less" in text
