"""The MLA report (report/mla.py): the cache per token against MHA's, what each form costs, and
what `trace` prints of both."""

import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.passes import run
from graphllm.report.mla import form_costs, kv_per_token


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
