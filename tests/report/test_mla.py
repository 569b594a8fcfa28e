"""MLA's cache per token against MHA's, and the naive against the absorbed form."""

import numpy as np
import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.build.weights import random_weights
from graphllm.passes import run
from graphllm.report.mla import form_costs, kv_per_token
from graphllm.runtime.interpret import run_graph
from graphllm.runtime.observe import small_instance


def test_kv_per_token_v3_and_v2_lite():
    v3 = kv_per_token(load_config("deepseek-v3"))
    assert v3.mla_values == 61 * (512 + 64)
    assert v3.mha_values == 61 * 128 * (192 + 128)
    assert v3.mla_bytes == 2 * 61 * 576 and round(v3.ratio, 2) == 71.11
    lite = kv_per_token(load_config("deepseek-v2-lite"), "fp32")
    assert lite.mla_values == 27 * 576 and lite.mha_values == 27 * 16 * 320
    assert lite.mla_bytes == 4 * 27 * 576


@pytest.mark.parametrize("mla", ["naive", "absorbed"])
def test_memory_pass_caches_only_the_latent_and_rope_key(mla):
    cfg = load_config("deepseek-v3")
    wl = Workload(batch=2, seq_len=3, past_len=100)
    mem = run(build_graph(cfg, wl, mla=mla), ["memory"])["memory"]
    assert mem.kv_cache == 2 * 103 * kv_per_token(cfg).mla_bytes


def test_absorbed_decode_is_far_cheaper_and_prefill_is_not():
    cfg = load_config("deepseek-v3")
    decode = form_costs(cfg, Workload(seq_len=1, past_len=4096))
    naive, absorbed = decode["naive"], decode["absorbed"]
    # naive: every step expands 4097 cached latents through kv_b_proj in each of 61 layers
    h, r, dn, dv, dr, s = 128, 512, 128, 128, 64, 4097
    expand = 61 * 2 * s * r * h * (dn + dv)
    naive_core = 61 * 2 * h * s * ((dn + dr) + dv)
    absorbed_core = 61 * 2 * h * (dn * r + s * (r + dr) + s * r + r * dv)
    assert naive.matmul_flops - absorbed.matmul_flops == expand + naive_core - absorbed_core
    assert naive.flops > 50 * absorbed.flops and naive.bytes > 2 * absorbed.bytes
    prefill = form_costs(cfg, Workload(seq_len=2048))
    assert prefill["absorbed"].matmul_flops > prefill["naive"].matmul_flops


@pytest.mark.parametrize("preset", ["deepseek-v2-lite", "deepseek-v2", "deepseek-v3"])
def test_absorbed_logits_equal_naive(preset):
    cfg = small_instance(load_config(preset), 6)
    wl = Workload(batch=2, seq_len=6, dtype="fp32")
    naive = build_graph(cfg, wl)
    w = random_weights(naive, seed=1, scale=0.2)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 6))
    a = run_graph(naive, w, ids)
    b = run_graph(build_graph(cfg, wl, mla="absorbed"), w, ids)
    np.testing.assert_allclose(a["logits"], b["logits"], atol=1e-5, rtol=0)
    step = Workload(batch=2, seq_len=1, past_len=6, dtype="fp32")
    nxt = ids[:, :1]
    past = {k: v for k, v in a.items() if k.startswith("present.")}
    a2 = run_graph(build_graph(cfg, step), w, nxt, past)["logits"]
    b2 = run_graph(build_graph(cfg, step, mla="absorbed"), w, nxt, past)["logits"]
    np.testing.assert_allclose(a2, b2, atol=1e-5, rtol=0)


@pytest.mark.parametrize("mla", ["naive", "absorbed"])
@pytest.mark.parametrize("preset", ["deepseek-v2-lite", "deepseek-v2", "deepseek-v3"])
def test_only_core_attention_mixes(preset, mla):
    cfg = load_config(preset)
    report = run(build_graph(cfg, Workload(seq_len=4, past_len=5), mla=mla), ["tokens"])["tokens"]
    names = {name for name, _ in report.mixing_nodes}
    assert len(names) == 3 * cfg.num_hidden_layers
    assert all(".self_attn.core." in name for name in names)


@pytest.mark.parametrize("preset", ["deepseek-v2-lite", "deepseek-v2", "deepseek-v3"])
def test_token_mixing_prediction_matches_perturbation(preset):
    from graphllm.runtime.observe import check_token_mixing

    assert check_token_mixing(load_config(preset), seq_len=8).agrees
    assert check_token_mixing(load_config(preset), workload=Workload(seq_len=3, past_len=4)).agrees


def test_unknown_mla_form_is_one_line():
    from graphllm import ConfigError

    with pytest.raises(ConfigError, match="mla must be one of naive, absorbed"):
        build_graph(load_config("deepseek-v3"), mla="fast")


def test_trace_reports_the_cache_against_mha_and_both_forms():
    import json

    from click.testing import CliRunner

    from graphllm.cli import main

    args = ["trace", "--model", "deepseek-v2-lite", "--seq-len", "1", "--past-len", "4096"]
    r = CliRunner().invoke(main, [*args, "--json"])
    assert r.exit_code == 0, r.output
    mla = json.loads(r.stdout)["mla"]
    assert mla["kv_cache_per_token"]["mla_values"] == 27 * 576
    assert round(mla["kv_cache_per_token"]["ratio"], 2) == round(16 * 320 / 576, 2)
    assert mla["forms"]["naive"]["flops"] > 2 * mla["forms"]["absorbed"]["flops"]
    text = " ".join(CliRunner().invoke(main, args).stdout.split())  # rich wraps at 80 columns
    assert "against" in text and "with standard multi-head attention (8.9x less)" in text
    assert (
        "latent attention" not in CliRunner().invoke(main, ["trace", "--model", "llama3-8b"]).stdout
    )
