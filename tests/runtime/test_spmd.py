"""The SPMD interpreter's sharding of whole tensors onto ranks and back (runtime/spmd.py)."""

import numpy as np

from graphllm.passes.parallel.sharding import Mesh, Sharding
from graphllm.runtime.spmd import assemble, shard


def test_shard_and_assemble_are_inverse_with_nested_splits():
    mesh = Mesh((("cp", 2), ("tp", 2)))
    full = np.arange(2 * 8 * 4).reshape(2, 8, 4)
    sh = Sharding(((), (("cp", 2), ("tp", 2)), ()))
    coords = {tuple(c.values()): c for c in mesh.coords()}
    parts = {r: shard(full, sh, mesh, c) for r, c in coords.items()}
    assert parts[(1, 0)].tolist() == full[:, 4:6].tolist()  # cp outer, tp inner
    assert (assemble(parts, sh, mesh, coords) == full).all()
    held_once = Sharding(((),), frozenset({"tp"}))
    assert shard(np.ones(3), held_once, mesh, {"cp": 0, "tp": 1}).sum() == 0
