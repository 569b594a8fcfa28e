"""Tiny safetensors checkpoints for the tests that damage them: a valid one of examples/tiny.yaml
(written by the safetensors library itself, one file or sharded with an index), and the raw
header and data section of a file, to rewrite them as a careless or hostile writer would."""

from __future__ import annotations

import functools
import json
import struct
from pathlib import Path

import numpy as np
import yaml
from safetensors.numpy import save_file

from tests.support.paths import EXAMPLES

INDEX = "model.safetensors.index.json"
TINY = EXAMPLES / "tiny.yaml"


@functools.cache
def tiny_tensors() -> dict[str, np.ndarray]:
    """Every param of the tiny model's export graph, seeded, by its checkpoint name."""
    import graphllm
    from graphllm.build.builder import build_export_graph
    from graphllm.build.weights import random_weights

    return random_weights(build_export_graph(graphllm.load_config(TINY)), seed=1)


def tiny_config() -> dict:
    """The tiny model's fields as a transformers config.json holds them."""
    fields = yaml.safe_load(TINY.read_text())
    fields.pop("workload")
    return fields


def write_checkpoint(folder: Path, shards: int = 1) -> Path:
    """A valid checkpoint of the tiny model in `folder`: config.json and model.safetensors, or
    `shards` files and an index."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(tiny_config()))
    tensors = tiny_tensors()
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"))
        return folder
    names = list(tensors)
    wmap = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]
        save_file({n: tensors[n] for n in part}, str(folder / file))
        wmap |= dict.fromkeys(part, file)
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    return folder


def read_raw(path: Path) -> tuple[dict, bytes]:
    """A safetensors file's header (as JSON) and its data section."""
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def write_raw(
    path: Path, header: object, data: bytes, length: int | None = None, text: bytes | None = None
) -> None:
    """A safetensors file of `header` (or raw header bytes `text`) and `data`; `length` is the
    8-byte header length written, by default the true one."""
    raw = text if text is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
