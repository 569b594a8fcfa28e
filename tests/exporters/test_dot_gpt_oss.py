"""issue 18: the diagrams draw gpt-oss as it is: the sinks in the softmax, the window on the
even layers, biased projections and router, the interleaved gate/up and the clamped SwiGLU."""

from graphllm import Workload, build_graph, load_config
from graphllm.exporters.dot import view_dot


def test_attention_view_draws_the_sinks_and_the_window():
    g = build_graph(load_config("gpt-oss-20b"), Workload(seq_len=4))
    sliding, full = view_dot(g, "attention", layer=0), view_dot(g, "attention", layer=1)
    for part in ("softmax with a sink logit per head", "window 128", "linear_bias", "o_proj"):
        assert part in sliding, part
    assert "window" not in full and "sink" in full


def test_ffn_view_draws_the_biased_router_and_the_clamped_swiglu():
    dot = view_dot(build_graph(load_config("gpt-oss-120b"), Workload(seq_len=4)), "ffn", layer=0)
    for part in (
        "128 experts",
        "top-4",
        "router\\nlinear_bias",
        "gate = even, up = odd channels",
        "(clamp(up, ±7) + 1) · g·σ(1.702·g), g = min(gate, 7)",
        "expert_linear_bias",
    ):
        assert part in dot, part
