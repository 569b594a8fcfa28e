"""issue 19: the diagrams draw Qwen3-Next as it is: the model view's layer pattern (runs of three
Gated DeltaNet layers between attention layers), the linear-attention layer's block and mixer,
and the tokens view with the conv's window and the recurrence's prefix as its edges."""

import re

import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.errors import GraphllmError
from graphllm.exporters.dot import view_dot


@pytest.fixture(scope="module")
def graph():
    return build_graph(load_config("qwen3-next-80b-a3b").with_layers(8), Workload(seq_len=4))


def test_model_view_shows_the_layer_pattern(graph):
    dot = view_dot(graph, "model")
    assert "decoder block × 3\\nlayers 0-2\\nlinear attention (Gated DeltaNet) + MoE" in dot
    assert "16 key / 32 value heads, d_k 128, d_v 128, chunks of 64, conv 4" in dot
    assert "decoder block 3\\nmodel.layers.3\\nattention + MoE\\n16 heads / 2 kv heads" in dot
    assert "layers 4-6" in dot and "decoder block 7" in dot
    assert "mixes tokens: causal_conv1d, gated_delta_chunked" in dot


def test_block_and_mixer_views_of_a_linear_layer(graph):
    block = view_dot(graph, "block", layer=0)
    assert "linear attention (Gated DeltaNet)" in block
    mixer = view_dot(graph, "attention", layer=0)
    for part in (
        "causal conv, 4 taps per channel",
        "gated delta rule, chunks of 64",
        "RMSNorm · silu(z)",
        "padded positions to 0",
        "present.0.conv_state",
        "present.0.recurrent_state",
        "in_proj_qkvz",
        "out_proj",
    ):
        assert part in mixer, part
    assert "gated delta rule" not in view_dot(graph, "attention", layer=3)


def _gathers(dot: str, op: str) -> set[tuple[int, int]]:
    """(source column, destination column) of the mixing edges into `op`'s boxes."""
    pat = rf'"t(\d+):[^"]+" -> "t(\d+):model\.layers\.0\.linear_attn\.{op}" \[[^]]*gather'
    return {(int(a), int(b)) for a, b in re.findall(pat, dot)}


def test_tokens_view_draws_the_window_and_the_prefix(graph):
    g = build_graph(load_config("qwen3-next-80b-a3b").with_layers(1), Workload(seq_len=6))
    dot = view_dot(g, "tokens", layer=0)
    conv = _gathers(dot, "conv1d")
    assert conv == {(s, t) for t in range(1, 7) for s in range(max(1, t - 3), t + 1)}
    core = _gathers(dot, "core")
    assert core == {(s, t) for t in range(1, 7) for s in range(1, t + 1)}  # never a later one


def test_the_mtp_layer_is_drawn_after_the_main_layers():
    """--mtp: the model view's MTP box names its block's attention + MoE; the block view of
    layer n draws the pre-fc norms, fc and the shared head around that block; the attention
    view reaches into mtp.layers.0."""
    g = build_graph(load_config("qwen3-next-80b-a3b").with_layers(4), Workload(seq_len=4), mtp=True)
    model = view_dot(g, "model")
    assert "MTP depth 1: decoder block\\nmtp\\nattention + MoE" in model
    assert "(shared with mtp.lm_head)" in model and "(shared with mtp.embed_tokens)" in model
    block = view_dot(g, "block", layer=4)
    for part in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "concat [embedding, hidden]"):
        assert part in block, part
    assert "MoE" in block and "mixes tokens" in block
    assert "mtp.layers.0.self_attn.q_proj" in view_dot(g, "attention", layer=4)
    with pytest.raises(GraphllmError, match=r"--layer 5: .* 4 layers and 1 MTP module \(0-4\)"):
        view_dot(g, "block", layer=5)
