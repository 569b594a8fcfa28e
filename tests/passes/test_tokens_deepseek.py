"""The tokens pass on DeepSeek's latent attention, both forms: only core attention mixes, as
perturbation observes."""

import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.passes import run


@pytest.mark.parametrize("mla", ["naive", "absorbed"])
@pytest.mark.parametrize("preset", ["deepseek-v2-lite", "deepseek-v2", "deepseek-v3", "kimi-k2"])
def test_only_core_attention_mixes(preset, mla):
    cfg = load_config(preset)
    report = run(build_graph(cfg, Workload(seq_len=4, past_len=5), mla=mla), ["tokens"])["tokens"]
    names = {name for name, _ in report.mixing_nodes}
    assert len(names) == 3 * cfg.num_hidden_layers
    assert all(".self_attn.core." in name for name in names)


@pytest.mark.parametrize("preset", ["deepseek-v2-lite", "deepseek-v2", "deepseek-v3", "kimi-k2"])
def test_token_mixing_prediction_matches_perturbation(preset):
    from graphllm.runtime.observe import check_token_mixing

    assert check_token_mixing(load_config(preset), seq_len=8).agrees
    assert check_token_mixing(load_config(preset), workload=Workload(seq_len=3, past_len=4)).agrees
