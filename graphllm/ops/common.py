"""Helpers shared by the op rows' numpy reference implementations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from graphllm.ir import Dim, Node


# -- numpy reference implementations ---------------------------------------------------------
def f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def size_one(what: str) -> Callable[[Node, dict[str, Dim]], str | None]:
    """A check that axis `o` has size 1, saying `what` it is."""

    def check(node: Node, env: dict[str, Dim]) -> str | None:
        return None if env["o"].size == 1 else what

    return check


def qk(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return f32(xs[0]) @ f32(xs[1]).swapaxes(-1, -2)


def add_impl(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return f32(xs[0]) + f32(xs[1])


def weighted_values(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return f32(xs[0]) @ f32(xs[1])


def rope_flops(sizes: dict[str, float], attrs: dict[str, Any]) -> float:
    """3 FLOPs per rotated element of (b, h, t, e): the op turns 2 * len(inv_freq) channels."""
    return 3 * sizes["b"] * sizes["h"] * sizes["t"] * 2 * len(attrs["inv_freq"])
