"""The two MLA forms the builder makes (build/mla.py): the absorbed graph computes the naive
one's logits, prefill and cached step, from the same weights."""

import numpy as np
import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.build.weights import random_weights
from graphllm.runtime.interpret import run_graph
from graphllm.runtime.observe import small_instance


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


def test_unknown_mla_form_is_one_line():
    from graphllm import ConfigError

    with pytest.raises(ConfigError, match="mla must be one of naive, absorbed"):
        build_graph(load_config("deepseek-v3"), mla="fast")
