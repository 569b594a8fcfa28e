"""The checkpoint reader against mutated safetensors files, in-process: whatever the header and
the bytes hold, SafetensorsFolder and its reads either give exactly what the safetensors library
reads from the same file, or raise WeightsError; nothing else escapes."""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

from graphllm.build.weights import SafetensorsFolder, checkpoint_tensors
from graphllm.errors import WeightsError
from tests.support.checkpoints import INDEX, read_raw, write_checkpoint, write_raw

# a few tensors of the dtypes graphllm reads, one of them empty and one a scalar
TENSORS = {
    "a": np.arange(12, dtype=np.float32).reshape(3, 4),
    "b": np.arange(6, dtype=np.float16).reshape(2, 3),
    "c": np.arange(5, dtype=ml_dtypes.bfloat16),
    "d": np.arange(4, dtype=np.int64),
    "e": np.zeros((0, 3), dtype=np.float32),
    "f": np.array(2.5, dtype=np.float64),
}
NAMES = sorted(TENSORS)
FIELDS = ["dtype", "shape", "data_offsets"]
DTYPES = ["F32", "F16", "BF16", "F64", "I64", "I32", "I8", "U8", "F8_E4M3", "BOOL", "f32", ""]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
small_ints = st.integers(-4, 80)
huge_ints = st.integers(0, 10**400)  # an error line must not print them whole
field_values = {
    "dtype": st.sampled_from(DTYPES) | json_values,
    "shape": st.lists(small_ints, max_size=3) | st.lists(huge_ints, max_size=2) | json_values,
    "data_offsets": st.lists(st.integers(-8, 200), max_size=3)
    | st.lists(huge_ints, max_size=2)
    | json_values,
}
header_edits = st.one_of(
    st.tuples(st.just("drop"), st.sampled_from(NAMES), st.sampled_from(FIELDS)),
    *(
        st.tuples(st.just("set"), st.sampled_from(NAMES), st.just(f), values)
        for f, values in field_values.items()
    ),
    st.tuples(st.just("extra"), st.sampled_from(NAMES), st.text(max_size=4), json_values),
    st.tuples(st.just("entry"), st.sampled_from(NAMES), json_values),
    st.tuples(st.just("metadata"), json_values),
)
byte_edits = st.one_of(
    st.tuples(st.just("length"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("length-delta"), st.integers(-16, 16)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("trim"), st.integers(1, 64)),
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(0, 255)),
)


def _edit_header(header: dict, edit: tuple) -> dict:
    kind, *args = edit
    if kind == "metadata":
        header["__metadata__"] = args[0]
    elif kind == "entry":
        header[args[0]] = args[1]
    elif isinstance(header.get(args[0]), dict):
        entry = header[args[0]]
        if kind == "drop":
            entry.pop(args[1], None)
        else:
            entry[args[1]] = args[2]
    return header


def _edit_bytes(blob: bytes, edit: tuple) -> bytes:
    kind, *args = edit
    if kind == "length":
        return struct.pack("<Q", args[0]) + blob[8:]
    if kind == "length-delta":
        # the header length stays a u64 however far a delta pushes it
        n = min(max(0, struct.unpack("<Q", blob[:8])[0] + args[0]), (1 << 64) - 1)
        return struct.pack("<Q", n) + blob[8:]
    if kind == "append":
        return blob + args[0]
    if kind == "trim":
        return blob[: max(0, len(blob) - args[0])]
    at = args[0] % max(1, len(blob))
    return blob[:at] + bytes([args[1]]) + blob[at + 1 :]


def _read_all(folder: Path) -> dict[str, np.ndarray]:
    ckpt = SafetensorsFolder(folder)
    return {name: ckpt.read(name) for name in ckpt.names()}


def _agrees_with_safetensors(folder: Path, got: dict[str, np.ndarray]) -> None:
    """What we read is what the reference reader reads, each tensor as float32."""
    want = load_file(str(folder / "model.safetensors"))
    assert set(got) == set(want)
    for name, arr in want.items():
        assert got[name].dtype == np.float32
        np.testing.assert_array_equal(got[name], arr.astype(np.float32), err_msg=name)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(header_edits, max_size=3),
    raw_edits=st.lists(byte_edits, max_size=2),
)
def test_mutated_headers_read_right_or_refuse(edits, raw_edits):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = folder / "model.safetensors"
        save_file(TENSORS, str(path))
        header, data = read_raw(path)
        for edit in edits:
            header = _edit_header(header, edit)
        write_raw(path, header, data)
        blob = path.read_bytes()
        for edit in raw_edits:
            blob = _edit_bytes(blob, edit)
        path.write_bytes(blob)
        try:
            got = _read_all(folder)
        except WeightsError as e:
            assert "\n" not in str(e) and len(str(e)) < 1000
            return
        _agrees_with_safetensors(folder, got)


def test_the_unmutated_file_reads_as_written(tmp_path):
    save_file(TENSORS, str(tmp_path / "model.safetensors"))
    got = _read_all(tmp_path)
    for name, arr in TENSORS.items():
        np.testing.assert_array_equal(got[name], arr.astype(np.float32))


file_names = st.one_of(
    st.text(alphabet="./ab\\\0", max_size=12),
    st.sampled_from(["../outside.safetensors", "/etc/passwd", "a/../../b", "./model.safetensors"]),
    json_values,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["x", "y"]), file_names, max_size=2) | json_values)
def test_mutated_indexes_stay_inside_or_refuse(weight_map):
    """An index names files only inside its folder: anything else is a WeightsError."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = root / "ck"
        folder.mkdir()
        save_file({"x": TENSORS["a"]}, str(root / "outside.safetensors"))
        save_file({"x": TENSORS["a"]}, str(folder / "model.safetensors"))
        (folder / INDEX).write_text(json.dumps({"weight_map": weight_map}))
        try:
            ckpt = SafetensorsFolder(folder)
        except WeightsError:
            return
        assert {ckpt._where[n].path for n in ckpt.names()} == {folder / "model.safetensors"}


def test_a_hub_cache_snapshot_reads_through_its_blob_links(tmp_path):
    """The hub client's layout: snapshots/REV/* are symlinks to ../../blobs/HASH."""
    repo = tmp_path / "models--org--tiny"
    src = write_checkpoint(tmp_path / "src")
    snapshot = repo / "snapshots" / "abc123"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, f in enumerate(sorted(src.iterdir())):
        blob = repo / "blobs" / f"hash{i}"
        f.rename(blob)
        (snapshot / f.name).symlink_to(Path("../../blobs") / blob.name)
    import graphllm
    from graphllm.build.builder import build_export_graph

    cfg = graphllm.load_config(snapshot)
    names = [n.name for n, _ in checkpoint_tensors(build_export_graph(cfg), snapshot)]
    assert "lm_head.weight" in names
    # the same links from a folder that is not a snapshot lead outside it
    plain = tmp_path / "plain"
    snapshot.rename(plain)
    with pytest.raises(WeightsError, match="points outside the folder"):
        SafetensorsFolder(plain)


def test_a_bad_checkpoint_is_refused_before_any_tensor_is_read(tmp_path, monkeypatch):
    """checkpoint_tensors validates the whole folder when called, not when first iterated:
    the export has not started writing when it fails."""
    folder = write_checkpoint(tmp_path / "ck", shards=2)
    shard = sorted(folder.glob("*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:-1])
    import graphllm
    from graphllm.build.builder import build_export_graph

    graph = build_export_graph(graphllm.load_config(folder))
    reads = []
    monkeypatch.setattr(SafetensorsFolder, "read", lambda self, n: reads.append(n))
    with pytest.raises(WeightsError, match="truncated"):
        checkpoint_tensors(graph, folder)
    assert reads == []


def test_a_file_changed_after_validation_is_refused(tmp_path):
    """A file truncated between the header check and the read would otherwise be mapped past
    its end (SIGBUS)."""
    folder = write_checkpoint(tmp_path / "ck")
    ckpt = SafetensorsFolder(folder)
    path = folder / "model.safetensors"
    os.truncate(path, path.stat().st_size // 2)
    with pytest.raises(WeightsError, match="changed size"):
        ckpt.read("lm_head.weight")
