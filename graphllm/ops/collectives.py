"""Op rows that move values between devices: collectives and point-to-point send/recv.

Each impl takes the input of every rank of the group, in rank order, and returns every rank's output."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphllm.ir import Dim, Node
from graphllm.ir.opspec import (
    COMMUNICATION,
    MOVEMENT,
    OpSpec,
    register,
)
from graphllm.ops.common import f32


# -- collectives: each impl gets the input of every rank of the group, in rank order ----------
def _sum(xs: list[np.ndarray]) -> np.ndarray:
    out = f32(xs[0]).copy()
    for x in xs[1:]:
        out += f32(x)
    return out


def _all_reduce(xs: list[np.ndarray], a: dict[str, Any]) -> list[np.ndarray]:
    return [_sum(xs)] * len(xs)


def _all_gather(xs: list[np.ndarray], a: dict[str, Any]) -> list[np.ndarray]:
    return [np.concatenate(xs, axis=a["axis"])] * len(xs)


def _reduce_scatter(xs: list[np.ndarray], a: dict[str, Any]) -> list[np.ndarray]:
    return np.split(_sum(xs), len(xs), axis=a["axis"])


def _all_to_all(xs: list[np.ndarray], a: dict[str, Any]) -> list[np.ndarray]:
    blocks = [np.split(x, len(xs), axis=a["split_axis"]) for x in xs]
    return [np.concatenate([b[j] for b in blocks], axis=a["concat_axis"]) for j in range(len(xs))]


def _recv(xs: list[np.ndarray], a: dict[str, Any]) -> list[np.ndarray]:
    return [xs[a["src"]]] * len(xs)


def _shard_slice(xs: list[np.ndarray], a: dict[str, Any]) -> list[np.ndarray]:
    return [np.split(x, len(xs), axis=a["axis"])[j] for j, x in enumerate(xs)]


def _retype(node: Node, dims: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """The input's dims, those that attrs['axes'] names by position (`@2`: axis 2) replaced."""
    out = list(dims)
    for k, d in node.attrs.get("axes", {}).items():
        out[int(k[1:])] = d
    return tuple(out)


def _log2(n: int) -> int:
    """Levels of a binary tree over n ranks: ceil(log2 n)."""
    return max(1, (n - 1).bit_length())


register(
    # collectives: payload and wire bytes per device come from `comm_bytes`; FLOPs are 0
    OpSpec(
        "all_reduce",
        "... -> ...",
        COMMUNICATION,
        _all_reduce,
        "Sum a tensor held as partial sums over a device group; every rank gets the sum.",
        collective=True,
        wire=lambda n: 2 * (n - 1) / n,
        latency_steps=lambda n: {"ring": 2 * (n - 1), "tree": 2 * _log2(n)},
    ),
    OpSpec(
        "all_gather",
        "... -> ...",
        COMMUNICATION,
        _all_gather,
        "Concatenate the group's blocks of axis `axis`; every rank gets the whole axis.",
        collective=True,
        retype=_retype,
        backward_redoes=True,
        payload="output",
        wire=lambda n: (n - 1) / n,
        latency_steps=lambda n: {"ring": n - 1},
        gathers=True,
    ),
    OpSpec(
        "reduce_scatter",
        "... -> ...",
        COMMUNICATION,
        _reduce_scatter,
        "Sum partial sums over a device group; rank i keeps block i of axis `axis`.",
        collective=True,
        retype=_retype,
        wire=lambda n: (n - 1) / n,
        latency_steps=lambda n: {"ring": n - 1},
    ),
    OpSpec(
        "all_to_all",
        "... -> ...",
        COMMUNICATION,
        _all_to_all,
        "Rank j sends block i of `split_axis` to rank i and concatenates what it receives "
        "along `concat_axis` (MoE dispatch to the experts' ranks, and back).",
        collective=True,
        retype=_retype,
        payload="group",
        wire=lambda n: (n - 1) / n,
        latency_steps=lambda n: {"pairwise": n - 1},
    ),
    OpSpec(
        "send",
        "... -> ...",
        COMMUNICATION,
        lambda xs, a: xs[0],
        "Hand an activation to the next pipeline stage (the stage that runs this node).",
        wire=lambda n: 1.0,
        latency_steps=lambda n: {"p2p": 1},
        comm_kind="send/recv",
    ),
    OpSpec(
        "recv",
        "... -> ...",
        COMMUNICATION,
        _recv,
        "Take the activation that stage `src` sent (the input is its send).",
        collective=True,
        timed_on_peer=True,
    ),
    OpSpec(
        "shard_slice",
        "... -> ...",
        MOVEMENT,
        _shard_slice,
        "Keep this rank's block of axis `axis` of a tensor every rank of the group holds whole "
        "(no communication).",
        collective=True,
        retype=_retype,
        view=True,
        backward_redoes=True,
    ),
)
