"""issue 18: the config fuzzer's draws for the fields of Llama 4's MoE layout and attention
(`interleave_moe_layer_step`, `moe_layers`, `attention_chunk_size`, NoPE, the temperature) and of
gpt-oss (`layer_types`, `sliding_window`, the clamp, `experts_per_token`, the experts), on their
tiny configs and their published ones.

Each draw loads and then builds a graph that verifies and runs in numpy (tiny configs), or is
refused in one line (ConfigError), quickly; nothing else escapes. A draw that loads keeps what
the fields say: the MoE layers the config names, a chunk or window on the layers that have one.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphllm import Workload, build_graph
from graphllm.build.weights import random_weights
from graphllm.errors import ConfigError
from graphllm.models.config import load_config
from graphllm.models.family import CHUNKED, SLIDING
from graphllm.runtime.interpret import run_graph
from tests.support.tiny_configs import GPT_OSS, LLAMA4_MOE

SECONDS = 5.0  # a tiny build and run takes a fraction of it; this catches a hang or a blow-up

# values near the fields' edges, and values of the wrong kind
edge_ints = st.sampled_from([0, 1, 2, 3, 4, 5, -1, -2, 2**31, 10**12, 10**400])
wrong = st.sampled_from([None, True, False, 1.5, -0.0, float("nan"), float("inf"), "2", [], {}])
ints = st.one_of(edge_ints, st.integers(-3, 9), wrong)
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), edge_ints, wrong)
layer_lists = st.one_of(
    st.lists(st.integers(-2, 6), max_size=6),
    st.lists(st.one_of(st.integers(0, 3), wrong), max_size=4),
    wrong,
)
flags = st.lists(st.one_of(st.sampled_from([0, 1]), wrong), max_size=6)
types = st.lists(
    st.sampled_from(["full_attention", "sliding_attention", CHUNKED, "linear_attention", ""]),
    max_size=6,
)

LLAMA4_FIELDS = {
    "interleave_moe_layer_step": ints,
    "moe_layers": layer_lists,
    "num_local_experts": ints,
    "num_experts_per_tok": ints,
    "intermediate_size_mlp": ints,
    "attention_chunk_size": ints,
    "no_rope_layer_interval": ints,
    "no_rope_layers": flags,
    "layer_types": types,
    "use_qk_norm": st.one_of(st.booleans(), wrong),
    "attn_temperature_tuning": st.one_of(st.booleans(), wrong),
    "floor_scale": floats,
    "attn_scale": floats,
    "num_hidden_layers": ints,
}
GPT_OSS_FIELDS = {
    "sliding_window": ints,
    "layer_types": types,
    "num_local_experts": ints,
    "num_experts_per_tok": ints,
    "experts_per_token": ints,
    "swiglu_limit": floats,
    "initial_context_length": ints,
    "num_hidden_layers": ints,
    "router_aux_loss_coef": floats,
    "attention_bias": st.one_of(st.booleans(), wrong),
}


@st.composite
def drawn(draw, base: dict, fields: dict) -> dict:
    d = dict(base)
    for key in draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=3)):
        if draw(st.booleans()) and key in d:
            del d[key]
        else:
            d[key] = draw(fields[key])
    return d


def _load_build_run(d: dict) -> None:
    start = time.monotonic()
    try:
        cfg = load_config(d)
    except ConfigError as e:
        assert "\n" not in str(e) and len(str(e)) < 400, str(e)[:500]
        assert time.monotonic() - start < SECONDS
        return
    n = cfg.num_hidden_layers
    assert len(cfg.moe_layers) in (0, n) and len(cfg.layer_types) in (0, n)
    if isinstance(d.get("moe_layers"), list):
        # Llama 4: the layers it names, as transformers' decoder layer asks `i in moe_layers`
        # (an index past the last layer names none)
        named = sorted({i for i in d["moe_layers"] if 0 <= i < n})
        assert [i for i, moe in enumerate(cfg.moe_layers) if moe] == named
    for kind, size in ((CHUNKED, cfg.attention_chunk_size), (SLIDING, cfg.sliding_window)):
        if kind in cfg.layer_types:
            assert isinstance(size, int) and size > 0
    if n > 6 or cfg.num_experts > 16 or cfg.hidden_size > 64:
        return  # a valid config too large to run here: its loading was the test
    g = build_graph(cfg, Workload(seq_len=5, dtype="fp32"))
    g.verify()
    ids = np.arange(5)[None] % cfg.vocab_size
    out = run_graph(g, random_weights(g, seed=0), ids)
    assert np.isfinite(out["logits"]).all()
    assert time.monotonic() - start < SECONDS


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn(LLAMA4_MOE, LLAMA4_FIELDS))
def test_llama4_moe_layouts_load_and_run_or_are_refused_in_one_line(d):
    _load_build_run(d)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn(GPT_OSS, GPT_OSS_FIELDS))
def test_gpt_oss_fields_load_and_run_or_are_refused_in_one_line(d):
    _load_build_run(d)


@pytest.mark.parametrize(("preset", "fields"), [("llama4-scout", LLAMA4_FIELDS)])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_published_text_config_mutated_loads_or_is_refused(preset, fields, data):
    from graphllm.models.config import PRESETS_DIR
    from graphllm.models.parse import read_mapping

    d = read_mapping(PRESETS_DIR / f"{preset}.json")
    d = {k: v for k, v in d.items() if not k.startswith("_")}
    d["text_config"] = data.draw(drawn(d["text_config"], fields))
    start = time.monotonic()
    try:
        load_config(d)
    except ConfigError as e:
        assert "\n" not in str(e) and len(str(e)) < 400, str(e)[:500]
    assert time.monotonic() - start < SECONDS
