"""A sink logit each query computes (Inkling 2's per-token sinks), as the traced attention
lowers it: softmax_token_sink against the model's own cat-softmax-slice."""

from __future__ import annotations

import numpy as np
import pytest

from graphllm.build.dims import B, S, T
from graphllm.ir import Dim, Graph, TensorType
from graphllm.runtime.interpret import Interpreter

H, ONE = Dim("h", "head", 3), Dim("one", "hidden", 1)


def _graph() -> Graph:
    g = Graph("sinks", {"B": 2, "T": 4, "P": 0, "S": 4})
    x = g.input("scores", TensorType((B, H, T, S), "fp32"))
    sink = g.input("sink", TensorType((B, H, T, ONE), "fp32"))
    g.set_output("logits", g.add("softmax_token_sink", "softmax", (x, sink)))
    return g


def test_a_sink_each_query_computes():
    torch = pytest.importorskip("torch")

    rng = np.random.default_rng(0)
    feeds = {
        "scores": rng.standard_normal((2, 3, 4, 4)).astype(np.float32),
        "sink": rng.standard_normal((2, 3, 4, 1)).astype(np.float32),
    }
    # what Inkling 2's eager attention computes: the sink one more logit, dropped after
    both = torch.cat([torch.from_numpy(feeds["scores"]), torch.from_numpy(feeds["sink"])], -1)
    want = torch.softmax(both, dim=-1)[..., :-1].numpy()
    g = _graph()
    np.testing.assert_allclose(Interpreter(g, {}).run(feeds)["logits"], want, atol=1e-6)
    # a query's sink is read at its own position: the softmax mixes keys, not the sinks
    assert g["softmax"].outputs[0].dims == (B, H, T, S)
