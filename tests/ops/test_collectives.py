"""The collectives' numpy impls (ops/collectives.py): each takes every rank's input and gives
every rank's output."""

import numpy as np

from graphllm.ops import OPS


def impl(op, xs, **attrs):
    return OPS[op].impl(list(xs), attrs)


def test_collectives_combine_the_ranks_inputs():
    a, b = np.arange(6.0).reshape(2, 3), np.ones((2, 3))
    s = impl("all_reduce", [a, b])
    assert len(s) == 2 and (s[0] == a + b).all() and (s[1] == a + b).all()
    g = impl("all_gather", [a, b], axis=1)
    assert g[0].shape == (2, 6) and (g[1][:, 3:] == b).all()
    rs = impl("reduce_scatter", [a, b], axis=0)
    assert (rs[0] == (a + b)[:1]).all() and (rs[1] == (a + b)[1:]).all()
    assert (impl("recv", [a, None], src=0)[1] == a).all()
    sl = impl("shard_slice", [a, a], axis=0)
    assert (sl[1] == a[1:]).all() and sl[0].shape == (1, 3)


def test_all_to_all_moves_a_split_and_back():
    rng = np.random.default_rng(0)
    whole = rng.standard_normal((4, 6))  # (experts, slots)
    ranks = np.split(whole, 2, axis=1)  # each rank holds its slots of every expert
    there = impl("all_to_all", ranks, split_axis=0, concat_axis=1)
    assert [x.shape for x in there] == [(2, 6), (2, 6)]  # its experts, every slot
    assert (there[1] == whole[2:]).all()
    back = impl("all_to_all", there, split_axis=1, concat_axis=0)
    assert all((x == y).all() for x, y in zip(back, ranks))
