"""The cut points of a rank's program carried out on torch.distributed.

Each collective row of the op table has one torch.distributed call here (its lowering onto the
library, as graphllm.exporters has lowerings onto ONNX), over the process group of the node's
mesh axis: the ranks whose device coordinates differ on that axis alone. Every group of every
axis is made on every rank in the same order (torch.distributed requires it). The values are
torch tensors on the rank's device (graphllm.runtime.dist.tensors), as the segments hand them
over: an all_reduce sums into its input in place (into a copy where a later step reads that
input too), the others fill buffers made on the same device, so on NCCL nothing goes through
the host. `shard_slice` is local (a rank keeps its block of a value its group holds whole) and
is sliced here too, on the device.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from graphllm.errors import GraphllmError
from graphllm.ir import Graph, Node
from graphllm.ops import OPS
from graphllm.passes.parallel.sharding import Mesh
from graphllm.runtime.dist.records import CollectiveTime
from graphllm.runtime.dist.tensors import to_torch


def device_mesh(mesh: Mesh) -> Mesh:
    """The device axes of a program's mesh (microbatches run one after another on a rank)."""
    return Mesh(tuple((n, s) for n, s in mesh.axes if n != "mb"))


def rank_of(world: Mesh, coords: dict[str, int]) -> int:
    """The global rank of device coordinates: row-major, the innermost axis (tp) fastest, the
    order of the partition report's devices."""
    r = 0
    for name, size in world.axes:
        r = r * size + coords.get(name, 0)
    return r


def coords_of(world: Mesh, rank: int) -> dict[str, int]:
    out = {}
    for name, size in reversed(world.axes):
        out[name] = rank % size
        rank //= size
    return {n: out[n] for n in world.names}


class Comm:
    """This rank's process groups and the torch.distributed calls of the cut points."""

    def __init__(self, world: Mesh, rank: int, timeout: float, device: str = "cpu") -> None:
        import torch.distributed as dist

        self.world, self.rank, self.device = world, rank, device
        self.coords = coords_of(world, rank)
        self.groups: dict[str, Any] = {}
        for name, size in world.axes:
            others = [n for n in world.names if n != name]
            seen: set[tuple[int, ...]] = set()
            for c in world.coords():  # every group of the axis, same order on every rank
                key = tuple(c[n] for n in others)
                if key in seen:
                    continue
                seen.add(key)
                ranks = [rank_of(world, c | {name: j}) for j in range(size)]
                # a group's own timeout: new_group does not take the world's (30 min by default)
                g = dist.new_group(ranks, timeout=timedelta(seconds=timeout))
                if all(c[n] == self.coords[n] for n in others):
                    self.groups[name] = g

    def run(
        self, program: Graph, node: Node, x: Any, mb: int, clock: float, kept: bool = False
    ) -> tuple[Any, CollectiveTime]:
        """Carry out cut point `node` on this rank's input `x` (a tensor on the rank's device;
        `kept`: a later step reads it too, so it is not written in place); its output and
        timing record."""
        spec = OPS[node.op]
        axis = node.attrs["mesh"]
        n = self.world.size(axis)
        lower = LOWERINGS.get(node.op)
        if lower is None:
            raise GraphllmError(f"{node.name}: no torch.distributed call for op {node.op}")
        start = time.perf_counter()
        if x is not None:
            x = to_torch(x, self.device)
            x = x.clone() if kept and node.op in IN_PLACE else x
        try:
            y, peer = lower(self, program, node, x, n)
        except Exception as e:  # a peer gone or silent: say which call waited on whom
            raise PeerError(
                f"{node.op} {node.name} over {axis} (group of {n}): {one_line(e)}"
            ) from None
        seconds = time.perf_counter() - start
        moved = y if spec.payload == "output" or x is None else x  # a recv: what came
        rec = CollectiveTime(
            node=node.name,
            kind=node.op,
            mesh_axis=axis,
            group_size=n,
            bytes=int(getattr(moved, "nbytes", 0)),
            microbatch=mb,
            start=start - clock,
            seconds=seconds,
            peer=peer,
        )
        return y, rec

    def peer(self, stage: int) -> int:
        """The global rank of the rank at pipeline stage `stage` with this rank's other coords."""
        return rank_of(self.world, self.coords | {"pp": stage})


PEER_STATUS = 4  # a rank's exit status when its failure is a PeerError (2: its own)


class PeerError(GraphllmError):
    """A torch.distributed call that failed: most often a peer rank died or went silent, so
    the launcher names a rank that failed on its own before it (PEER_STATUS)."""


def one_line(e: BaseException) -> str:
    """An exception as one line: its message's last non-empty line, without the C++ source
    location torch and gloo put first."""
    if isinstance(e, GraphllmError):
        return str(e)
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    last = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", lines[-1]) if lines else ""
    return f"{type(e).__name__}: {last[:300]}" if last else type(e).__name__


def world_call(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """A call over the world group (a barrier, pooling objects), its failure one line."""
    try:
        return fn(*args)
    except Exception as e:
        raise PeerError(f"{what}: {one_line(e)}") from None


Lowering = Callable[[Comm, Graph, Node, Any, int], tuple[Any, int | None]]
IN_PLACE = {"all_reduce"}  # the calls that write their input


def _all_reduce(c: Comm, g: Graph, node: Node, x: Any, n: int) -> tuple[Any, None]:
    import torch.distributed as dist

    t = x.contiguous()  # x itself, as the segments make their outputs
    dist.all_reduce(t, group=c.groups[node.attrs["mesh"]])
    return t, None


def _all_gather(c: Comm, g: Graph, node: Node, x: Any, n: int) -> tuple[Any, None]:
    import torch
    import torch.distributed as dist

    t = x.contiguous()
    out = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(out, t, group=c.groups[node.attrs["mesh"]])
    return torch.cat(out, dim=node.attrs["axis"]), None


def _reduce_scatter(c: Comm, g: Graph, node: Node, x: Any, n: int) -> tuple[Any, None]:
    import torch
    import torch.distributed as dist

    blocks = [b.contiguous() for b in x.tensor_split(n, dim=node.attrs["axis"])]
    out = torch.empty_like(blocks[0])
    dist.reduce_scatter(out, blocks, group=c.groups[node.attrs["mesh"]])
    return out, None


def _all_to_all(c: Comm, g: Graph, node: Node, x: Any, n: int) -> tuple[Any, None]:
    import torch
    import torch.distributed as dist

    a = node.attrs
    blocks = [b.contiguous() for b in x.tensor_split(n, dim=a["split_axis"])]
    out = [torch.empty_like(b) for b in blocks]
    dist.all_to_all(out, blocks, group=c.groups[a["mesh"]])
    return torch.cat(out, dim=a["concat_axis"]), None


def _send(c: Comm, g: Graph, node: Node, x: Any, n: int) -> tuple[Any, int]:
    import torch.distributed as dist

    peer = c.peer(node.attrs["dst"])
    dist.send(x.contiguous(), dst=peer)
    return x, peer


def _recv(c: Comm, g: Graph, node: Node, x: Any, n: int) -> tuple[Any, int]:
    """The buffer's shape and dtype come from the node's local type: the sender sends exactly
    that (values in fp32, integers as int64)."""
    import torch
    import torch.distributed as dist

    peer = c.peer(node.attrs["src"])
    t = node.out
    shape = tuple(int(s) for s in t.shape(g.bindings))
    dtype = torch.int64 if t.dtype in ("int64", "int32") else torch.float32
    buf = torch.empty(shape, dtype=dtype, device=c.device)
    dist.recv(buf, src=peer)
    return buf, peer


def _shard_slice(c: Comm, g: Graph, node: Node, x: Any, n: int) -> tuple[Any, None]:
    """Local: every rank of the group holds x whole and keeps its block (its own buffer, which
    a later collective may write in place)."""
    block = x.tensor_split(n, dim=node.attrs["axis"])[c.coords[node.attrs["mesh"]]]
    return (block.clone() if block.is_contiguous() else block.contiguous()), None


# op -> its torch.distributed call (the recv's input is its send on the peer: never read here)
LOWERINGS: dict[str, Lowering] = {
    "shard_slice": _shard_slice,
    "all_reduce": _all_reduce,
    "all_gather": _all_gather,
    "reduce_scatter": _reduce_scatter,
    "all_to_all": _all_to_all,
    "send": _send,
    "recv": _recv,
}
