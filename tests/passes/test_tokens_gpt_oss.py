"""issue 18: the tokens pass on gpt-oss: the sinks join the softmax without mixing tokens, so
only core attention mixes (three nodes a layer), as perturbation observes."""

import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.models.config import config_from_dict
from graphllm.passes import run
from tests.support import tiny_configs


@pytest.mark.parametrize("preset", ["gpt-oss-20b", "gpt-oss-120b"])
def test_only_core_attention_mixes(preset):
    cfg = load_config(preset)
    report = run(build_graph(cfg, Workload(seq_len=4, past_len=5)), ["tokens"])["tokens"]
    names = {name for name, _ in report.mixing_nodes}
    assert len(names) == 3 * cfg.num_hidden_layers
    assert all(".self_attn.core." in name for name in names)


def test_token_mixing_prediction_matches_perturbation():
    from graphllm.runtime.observe import check_token_mixing

    cfg = config_from_dict(dict(tiny_configs.GPT_OSS), "gpt_oss")
    assert check_token_mixing(cfg, seq_len=8).agrees
    assert check_token_mixing(cfg, workload=Workload(seq_len=3, past_len=4)).agrees
