"""issue 18: gpt-oss's config fields as the release and transformers write them, and what is
refused in one line."""

import pytest

from graphllm import load_config
from graphllm.errors import ConfigError
from graphllm.models.config import config_from_dict
from tests.support.tiny_configs import GPT_OSS


def test_published_config_reads_every_feature():
    c = load_config("gpt-oss-120b")
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (128, 4, 2880)
    assert c.attention_sinks and c.router_bias and c.topk_then_score and c.experts_stacked
    assert (c.qkv_bias, c.o_bias, c.swiglu_limit, c.swiglu_alpha) == (True, True, 7.0, 1.702)
    assert c.layer_types[:2] == ("sliding_attention", "full_attention") and c.sliding_window == 128
    assert (c.rope.type, c.rope.factor, c.rope.truncate, c.rope.theta) == (
        "yarn",
        32.0,
        False,
        150000,
    )
    assert c.quantization is not None and c.quantization.method == "mxfp4"
    assert all(c.moe_layers) and c.intermediate_size == 0


def test_transformers_defaults_fill_what_a_config_leaves_out():
    c = config_from_dict({k: v for k, v in GPT_OSS.items() if k != "swiglu_limit"}, "x")
    assert (c.swiglu_limit, c.swiglu_alpha, c.qkv_bias) == (7.0, 1.702, True)
    # without layer_types, the even layers slide (GptOssConfig's rule)
    assert c.layer_types == ("sliding_attention", "full_attention")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"experts_per_token": 3}, "experts_per_token 3 disagrees with num_experts_per_tok 2"),
        ({"sliding_window": None}, "sliding_window null is not modelled for gpt_oss"),
        ({"swiglu_limit": -1.0}, "swiglu_limit"),
    ],
)
def test_refused_in_one_line(change, message):
    with pytest.raises(ConfigError, match=message) as e:
        config_from_dict(GPT_OSS | change, "x")
    assert "\n" not in str(e.value)
