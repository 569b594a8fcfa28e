"""Weights for a graph's param nodes: seeded random ones, or read from a safetensors checkpoint.

The reader parses the safetensors header itself and views the data with numpy (bf16 through
ml_dtypes), so bf16, fp16 and fp32 checkpoints load the same way and nothing is ever unpickled.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np

from graphllm.errors import WeightsError
from graphllm.ir import Graph, Node

_ST_DTYPES = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F64": np.dtype(np.float64),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
}


_DTYPES = {"fp32": np.float32, "fp16": np.float16}
_CHUNK = 1 << 22  # random weights are drawn this many values at a time


def _shape(node: Node) -> tuple[int, ...]:
    return tuple(int(d.size) for d in node.out.dims)  # type: ignore[arg-type]


def random_tensors(
    graph: Graph, seed: int = 0, dtype: str = "fp32", scale: float = 0.02
) -> Iterator[tuple[Node, np.ndarray]]:
    """(param node, array) one at a time, seeded: normal(0, scale) matrices, norm weights near
    their identity value. Drawn a chunk at a time straight into `dtype`, so a large model never
    holds a float64 copy of a whole tensor; the values do not depend on the chunking."""
    rng = np.random.default_rng(seed)
    offset = graph.meta["config"].norm_weight_offset if "config" in graph.meta else 0.0
    for n in graph.params():
        shape = _shape(n)
        out = np.empty(shape, _DTYPES[dtype])
        flat = out.reshape(-1)
        norm = len(shape) == 1 and n.attrs["kind"] == "norms"
        for start in range(0, flat.size, _CHUNK):
            z = rng.standard_normal(min(_CHUNK, flat.size - start))
            v = (1.0 - offset) + 0.1 * z if norm else scale * z
            flat[start : start + z.size] = v.astype(np.float32)
        yield n, out


def random_weights(graph: Graph, seed: int = 0, scale: float = 0.02) -> dict[str, np.ndarray]:
    """Every param of `graph` as `random_tensors` draws it, in float32, by name."""
    return {n.name: arr for n, arr in random_tensors(graph, seed, "fp32", scale)}


class SafetensorsFolder:
    """The tensors of a checkpoint folder (one file or sharded with an index), read lazily."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise WeightsError(f"weights folder {self.folder} does not exist")
        index = self.folder / "model.safetensors.index.json"
        if index.exists():
            try:
                wmap = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError) as e:
                raise WeightsError(f"{index}: not a safetensors index ({e})") from None
            files = sorted(set(wmap.values()))
        else:
            files = sorted(p.name for p in self.folder.glob("*.safetensors"))
            if not files:
                raise WeightsError(f"no .safetensors files in {self.folder}")
        self._where: dict[str, tuple[Path, int, dict]] = {}  # name -> file, data start, info
        for f in files:
            path = self.folder / f
            base = 8 + _header_len(path)
            for name, info in _header(path).items():
                if name != "__metadata__":
                    self._where[name] = (path, base, info)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def read(self, name: str) -> np.ndarray:
        """One tensor as float32."""
        if name not in self._where:
            raise WeightsError(f"checkpoint {self.folder} has no tensor {name}")
        path, base, info = self._where[name]
        dt = _ST_DTYPES.get(info["dtype"])
        if dt is None:
            raise WeightsError(f"{name}: safetensors dtype {info['dtype']} is not supported")
        start, end = info["data_offsets"]
        count = math.prod(info["shape"])
        if end - start != count * dt.itemsize:
            raise WeightsError(f"{name}: data size does not match its shape in {path.name}")
        mm = np.memmap(path, dtype=np.uint8, mode="r", offset=base + start, shape=(end - start,))
        return mm.view(dt).reshape(info["shape"]).astype(np.float32)


def _header_len(path: Path) -> int:
    with open(path, "rb") as f:
        raw = f.read(8)
    if len(raw) != 8:
        raise WeightsError(f"{path}: not a safetensors file")
    return struct.unpack("<Q", raw)[0]


def _header(path: Path) -> dict:
    n = _header_len(path)
    with open(path, "rb") as f:
        f.seek(8)
        try:
            return json.loads(f.read(n))
        except ValueError:
            raise WeightsError(f"{path}: corrupt safetensors header") from None


def checkpoint_tensors(
    graph: Graph, folder: str | Path, dtype: str = "fp32"
) -> Iterator[tuple[Node, np.ndarray]]:
    """(param node, array) one at a time, read from a safetensors folder by the graph's names;
    stacked experts gathered per expert. Every name is looked up before any tensor is read."""
    ckpt = SafetensorsFolder(folder)
    for n in graph.params():
        for name in _checkpoint_names(n):
            if name not in ckpt:
                raise WeightsError(f"checkpoint {ckpt.folder} has no tensor {name}")
    for n in graph.params():
        shape, names = _shape(n), _checkpoint_names(n)
        stacked = n.attrs.get("stacked") == "expert"
        want = shape[1:] if stacked else shape
        out = np.empty(shape, _DTYPES[dtype]) if stacked else None
        for e, name in enumerate(names):
            arr = ckpt.read(name)
            if arr.shape != want:
                raise WeightsError(f"{name}: checkpoint shape {arr.shape}, graph expects {want}")
            if stacked:
                out[e] = arr  # type: ignore[index]
            else:  # read() made a fresh float32 array: no second copy in fp32
                out = arr.astype(_DTYPES[dtype], copy=False)
            del arr
        yield n, out


def _checkpoint_names(n: Node) -> list[str]:
    if n.attrs.get("stacked") == "expert":
        return [n.name.replace("*", str(e)) for e in range(_shape(n)[0])]
    return [n.name]


def load_weights(graph: Graph, folder: str | Path) -> dict[str, np.ndarray]:
    """Every param of `graph` as `checkpoint_tensors` reads it, in float32, by name."""
    return dict((n.name, arr) for n, arr in checkpoint_tensors(graph, folder))
