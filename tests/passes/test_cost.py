"""FLOPs, bytes, memory and roofline: exact conventions and textbook facts on real configs."""

import numpy as np
import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.models.hardware import load_hardware
from graphllm.passes import run


def analyse(preset, hardware=None, attention="flash", training=False, **wl):
    graph = build_graph(load_config(preset), Workload(**wl))
    res = run(graph, ["params", "cost", "memory", "roofline"], hardware=hardware,
              attention=attention, training=training)  # fmt: skip
    return graph, res


def test_llama3_8b_matmul_equals_flop_counter_figure():
    # torch's FlopCounterMode on transformers' Llama-3-8B, B=1, T=2048, no past
    _, r = analyse("llama3-8b", seq_len=2048)
    assert r["cost"].flops["matmul"] == 32_938_104_193_024


def test_causal_count_keeps_only_allowed_pairs():
    cfg = load_config("llama3-8b")
    t = 2048
    _, r = analyse("llama3-8b", seq_len=t)
    f = r["cost"].flops
    # Q K^T and P V over the full square, per layer: 2 matmuls x 2 B H T S E
    square = 2 * 2 * cfg.num_attention_heads * t * t * cfg.head_dim * cfg.num_hidden_layers
    assert f["matmul"] - f["matmul_causal"] == pytest.approx(square * (1 - (t + 1) / (2 * t)))
    # a window keeps W keys per query (fewer for the first W-1)
    _, rw = analyse("mistral-7b", seq_len=8192)
    mc = load_config("mistral-7b")
    w = mc.sliding_window
    allowed = w * (w + 1) / 2 + (8192 - w) * w
    sq = 2 * 2 * mc.num_attention_heads * 8192 * 8192 * mc.head_dim * mc.num_hidden_layers
    fw = rw["cost"].flops
    assert fw["matmul"] - fw["matmul_causal"] == pytest.approx(sq * (1 - allowed / 8192**2))


def test_70b_decode_is_two_flops_per_parameter():
    _, r = analyse("llama3-70b", seq_len=1, past_len=16)
    params = r["params"].total
    assert r["cost"].flops["total"] == pytest.approx(2 * params, rel=0.02)  # ~141 GFLOPs
    assert 139e9 < r["cost"].flops["total"] < 143e9


def test_70b_parameters_are_mostly_mlp():
    _, r = analyse("llama3-70b", seq_len=1)
    k, total = r["params"].by_kind, r["params"].total
    assert k["mlp"] / total == pytest.approx(0.80, abs=0.01)
    assert k["attention"] / total == pytest.approx(0.17, abs=0.01)


def test_training_is_six_flops_per_parameter_per_token():
    t = 1024
    _, r = analyse("llama3-70b", seq_len=t, training=True)
    per_token = r["cost"].flops["total"] / t
    assert per_token == pytest.approx(6 * r["params"].total, rel=0.05)
    _, fwd = analyse("llama3-70b", seq_len=t)
    assert r["cost"].flops["matmul"] == 3 * fwd["cost"].flops["matmul"]


def test_moe_memory_follows_total_and_flops_follow_active():
    _, r = analyse("mixtral-8x7b", seq_len=1, past_len=16)
    p, mem = r["params"], r["memory"]
    assert mem.weights == 2 * p.total  # bf16
    assert mem.weights_active == 2 * p.active
    assert r["cost"].flops["total"] == pytest.approx(2 * p.active, rel=0.02)
    # one token touches k of E experts: exactly k/E of the expert weights are read
    cfg = load_config("mixtral-8x7b")
    experts = 2 * p.by_kind["moe_experts"]
    dense = 2 * (p.total - p.by_kind["moe_experts"] - p.by_kind["embedding"])
    gathered = 2 * cfg.hidden_size  # one embedding row
    expected = dense + gathered + experts * cfg.num_experts_per_tok / cfg.num_experts
    assert r["cost"].bytes["weights"] == pytest.approx(expected)


def test_many_tokens_touch_every_expert():
    _, r = analyse("mixtral-8x7b", seq_len=512)
    p = r["params"]
    assert r["cost"].bytes["weights"] == pytest.approx(
        2 * (p.total - p.by_kind["embedding"]) + 2 * 512 * 4096, rel=1e-6
    )


def test_decode_bytes_are_weights_plus_kv_cache():
    cfg = load_config("llama3-8b")
    b, p = 4, 4095
    _, r = analyse("llama3-8b", batch=b, seq_len=1, past_len=p)
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    by = r["cost"].bytes
    # read the whole cache, write one new position per sequence
    assert by["kv_cache"] == b * (p + 1) * kv_per_token + b * kv_per_token
    assert r["memory"].kv_cache == b * (p + 1) * kv_per_token
    assert by["weights"] == pytest.approx(
        2 * (r["params"].total - r["params"].by_kind["embedding"]) + 2 * b * cfg.hidden_size
    )


def test_sliding_window_cache_rolls():
    cfg = load_config("mistral-7b")
    w = cfg.sliding_window
    _, r = analyse("mistral-7b", seq_len=1, past_len=20_000)
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    assert r["memory"].kv_cache == (w - 1 + 1) * kv_per_token
    # the same cache with full attention on every layer: all 20,001 positions
    assert r["memory"].kv_cache_full == 20_001 * kv_per_token


def test_full_attention_cache_is_its_own_full_size():
    _, r = analyse("llama3-8b", seq_len=16, past_len=5_000)
    assert r["memory"].kv_cache_full == r["memory"].kv_cache


def test_trace_shows_what_the_windows_save():
    from click.testing import CliRunner

    from graphllm.cli import main

    args = ["trace", "--model", "mistral-7b", "-t", "1", "--past-len", "20000"]
    out = " ".join(CliRunner().invoke(main, args).stdout.split())
    assert "with full attention on every layer: windows save 80%" in out
    plain = CliRunner().invoke(main, ["trace", "--model", "llama3-8b"]).stdout
    assert "windows save" not in plain


def test_flash_skips_the_score_matrix():
    cfg = load_config("llama3-8b")
    t = 2048
    _, naive = analyse("llama3-8b", seq_len=t, attention="naive")
    _, flash = analyse("llama3-8b", seq_len=t, attention="flash")
    score = cfg.num_attention_heads * t * t * 2  # one T x S tensor in bf16, per layer
    gap = naive["cost"].bytes["total"] - flash["cost"].bytes["total"]
    # scores written, scale/mask/softmax each read + write, P read by P V: 7 passes at least
    assert gap > 7 * score * cfg.num_hidden_layers
    assert flash["memory"].activations < naive["memory"].activations
    assert naive["cost"].flops == flash["cost"].flops


def test_logits_for_the_last_position_only():
    cfg = load_config("llama3-8b")
    g_all, r_all = analyse("llama3-8b", seq_len=128)
    g_last, r_last = analyse("llama3-8b", seq_len=128, logits="last")
    head = 2 * cfg.hidden_size * cfg.vocab_size
    assert g_all["lm_head"].meta["cost"].matmul == 128 * head
    assert g_last["lm_head"].meta["cost"].matmul == head
    diff = r_all["cost"].flops["matmul"] - r_last["cost"].flops["matmul"]
    assert diff == 127 * head


def test_scopes_roll_up():
    g, r = analyse("qwen1.5-moe-a2.7b", seq_len=64)
    s = r["cost"].flops["by_scope"]
    assert s["core_attention"] < s["attention"]
    assert s["router"] + s["experts"] <= s["moe"]
    assert len(r["cost"].per_layer) == 24
    total_layers = sum(x["flops"] for x in r["cost"].per_layer)
    outside = s["embedding"] + s["lm_head"] + g["model.norm"].meta["cost"].flops
    assert total_layers + outside == pytest.approx(r["cost"].flops["total"])
    assert sum(r["cost"].flops["by_op"].values()) == pytest.approx(r["cost"].flops["total"])


def test_roofline_decode_is_bandwidth_bound():
    hw = load_hardware("h100").ideal()  # the peak arithmetic
    _, r = analyse("llama3-70b", seq_len=1, past_len=16, hardware=hw)
    roof = r["roofline"]
    assert roof.memory_bound_seconds / roof.seconds > 0.99
    assert roof.seconds == pytest.approx(r["cost"].bytes["total"] / 3.35e12, rel=0.01)
    assert 40 < roof.ms_per_token < 45  # ~141 GB of bf16 weights at 3.35 TB/s


def test_roofline_long_prefill_is_compute_bound():
    hw = load_hardware("h100")
    _, r = analyse("llama3-70b", seq_len=4096, hardware=hw)
    roof = r["roofline"]
    assert roof.compute_bound_seconds / roof.seconds > 0.9
    assert roof.tokens_per_second == pytest.approx(4096 / roof.seconds)


def test_int4_weights_shrink_bytes_with_their_scales():
    _, r16 = analyse("llama3-8b", seq_len=1, past_len=1)
    _, r4 = analyse("llama3-8b", seq_len=1, past_len=1, dtype="int4")
    ratio = r4["memory"].weights / r16["memory"].weights
    assert ratio == pytest.approx((4 + 16 / 128) / 16, rel=0.01)


def test_prefill_writes_keys_and_values_into_the_cache():
    cfg = load_config("llama3-8b")
    _, r = analyse("llama3-8b", seq_len=2048)
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    assert r["cost"].bytes["kv_cache"] == 2048 * kv_per_token == r["memory"].kv_cache


def test_flash_roofline_skips_masked_blocks():
    hw = load_hardware("h100").ideal()  # the peak arithmetic
    g, r = analyse("llama3-8b", seq_len=32768, hardware=hw)
    scores = g["model.layers.0.self_attn.core.scores"]
    oc, t = scores.meta["cost"], scores.meta["time"]
    assert t.seconds == pytest.approx(oc.matmul_causal / hw.peak("bf16"))
    _, naive = analyse("llama3-8b", seq_len=32768, hardware=hw, attention="naive")
    assert naive["roofline"].seconds > r["roofline"].seconds


def test_ms_per_token_divides_a_multi_token_step():
    hw = load_hardware("h100")
    _, r = analyse("llama3-8b", seq_len=4, past_len=100, hardware=hw)
    roof = r["roofline"]
    assert roof.ms_per_token == pytest.approx(1e3 * roof.seconds / 4)
    assert roof.to_dict()["ms_per_token"] == roof.ms_per_token


def test_training_roofline_counts_three_times_the_bytes():
    hw = load_hardware("h100").ideal()  # the peak arithmetic
    _, fwd = analyse("llama3-8b", seq_len=1, past_len=16, hardware=hw)
    _, trn = analyse("llama3-8b", seq_len=1, past_len=16, hardware=hw, training=True)
    assert trn["cost"].bytes == fwd["cost"].bytes and trn["cost"].bytes["pass"] == "forward"
    # decode is bandwidth-bound: the step's time follows the bytes
    assert trn["roofline"].seconds == pytest.approx(3 * fwd["roofline"].seconds, rel=0.01)


# issue 16: Gemma 2's window layers (every other one) hold what transformers' hybrid cache holds
def test_gemma2_window_layers_hold_w_minus_one_past_positions():
    cfg = load_config("gemma2-9b")
    w, p = cfg.sliding_window, 6_000
    _, r = analyse("gemma2-9b", seq_len=1, past_len=p)
    per_layer = 2 * cfg.num_key_value_heads * cfg.head_dim * 2  # K and V, bf16, per position
    half = cfg.num_hidden_layers // 2
    assert r["memory"].kv_cache == half * (w - 1 + 1) * per_layer + half * (p + 1) * per_layer
    assert r["memory"].kv_cache_full == cfg.num_hidden_layers * (p + 1) * per_layer
    from click.testing import CliRunner

    from graphllm.cli import main

    args = ["trace", "--model", "gemma-2-9b", "-t", "1", "--past-len", str(p)]
    out = " ".join(CliRunner().invoke(main, args).stdout.split())
    saved = 1 - r["memory"].kv_cache / r["memory"].kv_cache_full
    assert f"with full attention on every layer: windows save {saved:.0%}" in out


# issue 16: Gemma 3 27B's five local layers to one global: 52 windows of 1024, 10 full caches
def test_gemma3_local_layers_hold_w_minus_one_past_positions_and_the_global_ones_all():
    cfg = load_config("gemma3-27b")
    w, p = cfg.sliding_window, 8_000
    assert (w, cfg.layer_types.count("sliding_attention")) == (1024, 52)
    _, r = analyse("gemma3-27b", seq_len=1, past_len=p)
    per_layer = 2 * cfg.num_key_value_heads * cfg.head_dim * 2  # K and V, bf16, per position
    assert r["memory"].kv_cache == 52 * (w - 1 + 1) * per_layer + 10 * (p + 1) * per_layer
    assert r["memory"].kv_cache_full == 62 * (p + 1) * per_layer


@pytest.mark.parametrize(("preset", "rotated"), [("phi4-mini", 96), ("llama3-8b", 128)])
@pytest.mark.parametrize(("t", "past"), [(64, 0), (1, 64)])  # prefill, a decode step
def test_rope_counts_three_flops_per_rotated_element(preset, rotated, t, past):
    # issue 16: Phi-4-mini's partial rotary turns 96 of its 128 head channels; the other 32
    # pass through and cost nothing. A full-rotary model turns the whole head
    cfg, b = load_config(preset), 2
    assert (cfg.rotary_dim or cfg.head_dim) == rotated and cfg.head_dim == 128
    g, r = analyse(preset, batch=b, seq_len=t, past_len=past)
    per_layer = 3 * b * t * (cfg.num_attention_heads + cfg.num_key_value_heads) * rotated
    assert r["cost"].flops["by_op"]["rope"] == per_layer * cfg.num_hidden_layers
    scope = f"model.layers.{cfg.num_hidden_layers - 1}.self_attn"
    rope = sum(g[f"{scope}.{x}_rope"].meta["cost"].flops for x in "qk")
    assert rope == per_layer
    _, trained = analyse(preset, batch=b, seq_len=t, past_len=past, training=True)
    assert trained["cost"].flops["by_op"]["rope"] == 2 * per_layer * cfg.num_hidden_layers


def test_rope_on_adjacent_pairs_counts_its_rotated_channels():
    # Command R's RoPE pairs adjacent channels over the whole head; DeepSeek-V2's turns its
    # rope part only, which is the whole input of its rope_pairs nodes
    for preset in ("command-r", "deepseek-v2-lite"):
        g, _ = analyse(preset, batch=1, seq_len=16)
        ropes = [n for n in g.nodes() if n.op == "rope_pairs"]
        assert ropes
        for n in ropes:
            b, h, t, e = (d.size if d.size is not None else g.bindings[d.name] for d in n.out.dims)
            assert 2 * len(n.attrs["inv_freq"]) == e
            assert n.meta["cost"].flops == 3 * b * h * t * e


# issue 16: Llama 4's chunked layers hold the last C-1 keys (transformers keeps them in a
# DynamicSlidingWindowLayer of the chunk size), the NoPE global ones every key
def test_llama4_chunked_layers_hold_what_transformers_cache_holds(tiny_model):
    import numpy as np
    import torch

    m = tiny_model("llama4_text-chunked")
    p = 20
    ids = np.random.default_rng(0).integers(0, 128, (1, p))
    with torch.no_grad():
        cache = m.model(torch.from_numpy(ids), use_cache=True).cache
    held = [layer.keys.shape[2] for layer in cache.layers]  # before the next step
    chunk = m.cfg.attention_chunk_size
    assert held == [chunk - 1 if k == "chunked_attention" else p for k in m.cfg.layer_types]
    wl = Workload.with_dtype(batch=1, seq_len=1, past_len=p, dtype="fp32")
    r = run(build_graph(m.cfg, wl), ["memory"])["memory"]
    per_position = 2 * m.cfg.num_key_value_heads * m.cfg.head_dim * 4  # K and V, fp32
    # the step's present: what the cache held plus the new key, as its attention reads it
    assert r.kv_cache == sum(h + 1 for h in held) * per_position
    assert r.kv_cache_full == m.cfg.num_hidden_layers * (p + 1) * per_position


# issue 16 audit: after a prefill longer than the window, the window layers keep their last
# W - 1 positions (what transformers' cache holds), and trace says so beside the saving
def test_a_prefill_longer_than_the_window_keeps_w_minus_one_positions_per_window_layer():
    cfg = load_config("gemma3-1b")
    w, t = cfg.sliding_window, 2048
    local = cfg.layer_types.count("sliding_attention")
    _, r = analyse("gemma3-1b", seq_len=t)
    per_position = 2 * cfg.num_key_value_heads * cfg.head_dim * 2  # K and V, bf16
    m = r["memory"]
    assert m.kv_cache == m.kv_cache_full == cfg.num_hidden_layers * t * per_position
    assert m.kv_cache_kept == (local * (w - 1) + (cfg.num_hidden_layers - local) * t) * per_position
    from click.testing import CliRunner

    from graphllm.cli import main

    out = " ".join(CliRunner().invoke(main, ["trace", "--model", "gemma3-1b"]).stdout.split())
    saved = 1 - m.kv_cache_kept / m.kv_cache_full
    assert (
        f"kept for the next step; 54.53 MB with full attention on every layer: windows save {saved:.0%}"
        in out
    )


def test_the_kept_cache_is_what_transformers_cache_holds_after_a_prefill(tiny_model):
    m = tiny_model("gemma3-window")  # a window of 4 under the 8-token prompt, layer 2 global
    ids = np.random.default_rng(0).integers(3, 100, (2, 8))
    cache = m.hf(ids).cache
    held = sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers) * 4
    wl = Workload.with_dtype(batch=2, seq_len=8, dtype="fp32")
    kept = run(build_graph(m.cfg, wl), ["memory"])["memory"].kv_cache_kept
    assert kept == held and kept < run(build_graph(m.cfg, wl), ["memory"])["memory"].kv_cache


# issue 18 audit: Llama 4's saving comes from its chunks, and the line says so
def test_the_kv_saving_line_names_chunks_for_llama4():
    from click.testing import CliRunner

    from graphllm.cli import main

    _, r = analyse("llama4-scout", seq_len=1, past_len=32_768)
    saved = 1 - r["memory"].kv_cache / r["memory"].kv_cache_full
    args = ["trace", "--model", "llama4-scout", "-t", "1", "--past-len", "32768"]
    out = " ".join(CliRunner().invoke(main, args).stdout.split())
    assert f"with full attention on every layer: chunks save {saved:.0%}" in out
    assert "windows save" not in out
