"""Damaged and hostile checkpoints through `graphllm export --weights`, the command that reads
them: each is refused in one line naming the file and the tensor, before anything is written,
and nothing outside the checkpoint folder is read.

Each case writes a valid tiny checkpoint (tests/support/checkpoints.py), then damages it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.checkpoints import INDEX, read_raw, write_checkpoint, write_raw
from tests.support.hostile import Case, cases_params, check_case, run_cli

# --device cpu: `auto` imports onnxruntime to find a provider, which is not what is tested here
EXPORT = ["export", "--weights", "ck", "--device", "cpu", "-o", "out.onnx"]
ST = "model.safetensors"
Header = dict
Damage = Callable[[Header, bytes], "tuple[Header, bytes] | None"]


def _ck(root: Path, shards: int = 1) -> Path:
    return write_checkpoint(root / "ck", shards)


def header(damage: Damage) -> Callable[[Path], None]:
    """A make that rewrites model.safetensors's header and data through `damage`, which edits
    the header in place or returns a new (header, data)."""

    def make(root: Path) -> None:
        path = _ck(root) / ST
        h, data = read_raw(path)
        out = damage(h, data)
        write_raw(path, *(out or (h, data)))

    return make


def raw(blob: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    """A make that replaces model.safetensors's bytes by `blob(its bytes)`."""

    def make(root: Path) -> None:
        path = _ck(root) / ST
        path.write_bytes(blob(path.read_bytes()))

    return make


def index(edit: Callable[[dict, Path], object]) -> Callable[[Path], None]:
    """A make of a 2-shard checkpoint whose index is rewritten by `edit(index, root)` (edited in
    place, or replaced by what it returns; bytes are written as they are)."""

    def make(root: Path) -> None:
        folder = _ck(root, shards=2)
        data = json.loads((folder / INDEX).read_text())
        out = edit(data, root)
        out = data if out is None else out
        (folder / INDEX).write_bytes(out if isinstance(out, bytes) else json.dumps(out).encode())

    return make


def _outside(root: Path) -> Path:
    """A complete valid checkpoint outside the folder: were it read, the export would succeed."""
    return write_checkpoint(root / "outside") / ST


def _map_all(to: Callable[[Path], str]) -> Callable[[dict, Path], None]:
    def edit(data: dict, root: Path) -> None:
        _outside(root)
        data["weight_map"] = dict.fromkeys(data["weight_map"], to(root))

    return edit


def _first(h: Header) -> dict:
    return h[next(k for k in h if k != "__metadata__")]


def _set_first(field: str, value: object) -> Damage:
    def damage(h: Header, data: bytes) -> None:
        _first(h)[field] = value

    return damage


def _drop_first(field: str) -> Damage:
    def damage(h: Header, data: bytes) -> None:
        del _first(h)[field]

    return damage


def _alias(h: Header, data: bytes) -> None:
    """The later of two same-sized tensors reads the earlier one's bytes."""
    by_start = sorted((v["data_offsets"], k) for k, v in h.items() if k != "__metadata__")
    for i, (a, _) in enumerate(by_start):
        for b, later in by_start[i + 1 :]:
            if a[1] - a[0] == b[1] - b[0]:
                h[later]["data_offsets"] = list(a)
                return
    raise AssertionError("no two tensors of one size")


def _hole(h: Header, data: bytes) -> tuple[Header, bytes]:
    """16 unindexed bytes in the middle of the data section."""
    middle = sorted(v["data_offsets"][0] for k, v in h.items() if k != "__metadata__")[5]
    for k, v in h.items():
        if k != "__metadata__" and v["data_offsets"][0] >= middle:
            v["data_offsets"] = [x + 16 for x in v["data_offsets"]]
    return h, data[:middle] + b"\0" * 16 + data[middle:]


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _fifo(name: str, shards: int = 1) -> Callable[[Path], None]:
    def make(root: Path) -> None:
        folder = _ck(root, shards)
        target = folder / name
        target.unlink(missing_ok=True)
        os.mkfifo(target)

    return make


def _link(name: str, to: Callable[[Path], Path], shards: int = 1) -> Callable[[Path], None]:
    def make(root: Path) -> None:
        folder = _ck(root, shards)
        target = to(root)
        (folder / name).unlink(missing_ok=True)
        (folder / name).symlink_to(target)

    return make


def _remap(edit: Callable[[dict], None]) -> Callable[[dict, Path], None]:
    def apply(data: dict, root: Path) -> None:
        edit(data["weight_map"])

    return apply


def _first_shard_name(wmap: dict) -> str:
    return next(iter(wmap))


def _duplicate_unsharded(root: Path) -> None:
    folder = _ck(root)
    (folder / "copy.safetensors").write_bytes((folder / ST).read_bytes())


def _duplicate_across_shards(wmap: dict) -> None:
    """Shard 2 keeps its tensors but the index sends one of them to shard 1."""
    name = next(k for k, f in wmap.items() if f.startswith("model-00002"))
    wmap[name] = wmap[_first_shard_name(wmap)]


def _unlisted(wmap: dict) -> None:
    del wmap[_first_shard_name(wmap)]


def _renamed_missing(wmap: dict) -> None:
    wmap["model.extra.weight"] = wmap[_first_shard_name(wmap)]


PATHS = [
    Case("index-parent-escape", EXPORT, index(_map_all(lambda r: "../outside/" + ST)),
         expect="climbs out of the folder"),
    Case("index-deep-parent-escape", EXPORT,
         index(_map_all(lambda r: "sub/../../outside/" + ST)), expect="'..'"),
    Case("index-absolute", EXPORT, index(_map_all(lambda r: str(r / "outside" / ST))),
         expect="not a file name relative"),
    Case("index-symlink-escape", EXPORT, _link("model-00001-of-00002.safetensors", _outside, 2),
         expect="points outside the folder"),
    Case("symlink-escape", EXPORT, _link(ST, _outside), expect="points outside the folder"),
    Case("symlink-dev-zero", EXPORT, _link(ST, lambda r: Path("/dev/zero")),
         expect="points outside"),
    Case("index-symlink-itself-escapes", EXPORT,
         _link(INDEX, lambda r: write_checkpoint(r / "outside", 2) / INDEX, 2),
         expect="points outside"),
    Case("symlink-loop", EXPORT, _link("model-00001-of-00002.safetensors",
         lambda r: r / "ck" / "model-00001-of-00002.safetensors", 2), expect="cannot be resolved"),
    Case("index-missing-shard", EXPORT,
         index(_remap(lambda m: m.update(dict.fromkeys(m, "gone.safetensors")))),
         expect="does not exist"),
    Case("index-shard-is-folder", EXPORT,
         index(lambda d, r: (r / "ck" / "sub").mkdir() or d["weight_map"].update(
             dict.fromkeys(d["weight_map"], "sub"))), expect="not a regular file"),
    Case("index-value-int", EXPORT, index(_remap(lambda m: m.update(dict.fromkeys(m, 7)))),
         expect="not a file name"),
    Case("index-value-null", EXPORT, index(_remap(lambda m: m.update(dict.fromkeys(m, None)))),
         expect="not a file name"),
    Case("index-value-nul-byte", EXPORT,
         index(_remap(lambda m: m.update(dict.fromkeys(m, "a\0.safetensors")))),
         expect="not a file name relative"),
    Case("index-value-empty", EXPORT, index(_remap(lambda m: m.update(dict.fromkeys(m, "")))),
         expect="not a file name relative"),
    Case("index-a-list", EXPORT, index(lambda d, r: [d]), expect="not a safetensors index"),
    Case("index-no-weight-map", EXPORT, index(lambda d, r: {"metadata": {}}),
         expect="not a safetensors index"),
    Case("index-weight-map-list", EXPORT, index(lambda d, r: {"weight_map": ["a"]}),
         expect="weight_map must be"),
    Case("index-weight-map-empty", EXPORT, index(lambda d, r: {"weight_map": {}}),
         expect="weight_map must be"),
    Case("index-not-json", EXPORT, index(lambda d, r: b"{weight_map: "), expect="not valid JSON"),
    Case("index-deep-nesting", EXPORT, index(lambda d, r: _nested(100_000)),
         expect="nested too deeply"),
    Case("index-a-fifo", EXPORT, _fifo(INDEX, 2), expect="not a regular file"),
    Case("shard-a-fifo", EXPORT, _fifo("model-00002-of-00002.safetensors", 2),
         expect="not a regular file"),
    Case("file-a-fifo", EXPORT, _fifo(ST), expect="not a regular file"),
    Case("config-a-fifo", EXPORT, _fifo("config.json"), expect="not a regular file"),
    Case("config-symlink-escape", EXPORT,
         _link("config.json", lambda r: write_checkpoint(r / "outside") / "config.json"),
         expect="points outside"),
    Case("shard-tensor-unlisted", EXPORT, index(_remap(_unlisted)), expect="does not list it"),
    Case("tensor-in-two-shards", EXPORT, index(_remap(_duplicate_across_shards)),
         expect="maps it to model-00001"),
    Case("index-maps-absent-tensor", EXPORT, index(_remap(_renamed_missing)),
         expect="which does not hold it"),
    Case("tensor-in-two-files", EXPORT, _duplicate_unsharded, expect="is in both"),
]  # fmt: skip

HEADERS = [
    Case("empty-file", EXPORT, raw(lambda b: b""), expect="shorter than its 8-byte"),
    Case("five-byte-file", EXPORT, raw(lambda b: b[:5]), expect="shorter than its 8-byte"),
    Case("header-length-2^64-1", EXPORT, raw(lambda b: b"\xff" * 8 + b[8:]),
         expect="18,446,744,073,709,551,615 is past the format's cap"),
    Case("header-length-2^62", EXPORT, raw(lambda b: (1 << 62).to_bytes(8, "little") + b[8:]),
         expect="past the format's cap"),
    Case("header-length-past-eof", EXPORT,
         raw(lambda b: (len(b) + 1).to_bytes(8, "little") + b[8:]), expect="past the end of the file"),
    Case("header-not-utf8", EXPORT,
         raw(lambda b: (4).to_bytes(8, "little") + b"\xff\xfe{}" + b"\0" * 4),
         expect="not UTF-8"),
    Case("header-not-json", EXPORT,
         raw(lambda b: (5).to_bytes(8, "little") + b"{dty:"), expect="not valid JSON"),
    Case("header-deep-nesting", EXPORT,
         raw(lambda b: (200_000).to_bytes(8, "little") + _nested(100_000)),
         expect="nested too deeply"),
    Case("header-a-list", EXPORT, header(lambda h, d: ([h], d)), expect="header is a JSON list"),
    Case("header-a-number", EXPORT, header(lambda h, d: (7, d)), expect="JSON number"),
    Case("header-duplicate-key", EXPORT,
         raw(lambda b: (34).to_bytes(8, "little") + b'{"a": {}, "a": {}, "b": 1, "c": 1}'),
         expect="duplicate key"),
    Case("header-huge-int", EXPORT, raw(lambda b: _digits(5000)), expect="not valid JSON"),
    Case("metadata-a-list", EXPORT, header(lambda h, d: h.update(__metadata__=["x"])),
         expect="__metadata__"),
    Case("metadata-int-value", EXPORT, header(lambda h, d: h.update(__metadata__={"f": 1})),
         expect="__metadata__"),
]  # fmt: skip


def _digits(n: int) -> bytes:
    text = b'{"t": {"dtype": "F32", "shape": [' + b"9" * n + b'], "data_offsets": [0, 0]}}'
    return len(text).to_bytes(8, "little") + text


ENTRIES = [
    Case("entry-a-list", EXPORT, header(lambda h, d: h.update({next(iter(h)): [1]})),
         expect="entry is a JSON list"),
    Case("entry-no-dtype", EXPORT, header(_drop_first("dtype")), expect="entry has no dtype"),
    Case("entry-no-shape", EXPORT, header(_drop_first("shape")), expect="entry has no shape"),
    Case("entry-no-offsets", EXPORT, header(_drop_first("data_offsets")),
         expect="entry has no data_offsets"),
    Case("entry-extra-field", EXPORT, header(_set_first("offsets", [0, 4])),
         expect="unexpected field 'offsets'"),
    # an FP8 dtype on an F32 tensor's bytes: a quarter of the bytes would do
    Case("dtype-f8", EXPORT, header(_set_first("dtype", "F8_E4M3")), expect="data_offsets span"),
    Case("dtype-f8-e5m2", EXPORT, header(_set_first("dtype", "F8_E5M2")),
         expect="F8_E5M2 is not read"),
    Case("dtype-i8", EXPORT, header(_set_first("dtype", "I8")), expect="I8 is not read"),
    Case("dtype-unknown", EXPORT, header(_set_first("dtype", "F33")),
         expect="'F33' is not a safetensors dtype"),
    Case("dtype-int", EXPORT, header(_set_first("dtype", 4)), expect="not a safetensors dtype"),
    Case("shape-negative", EXPORT, header(_set_first("shape", [-1, 64])), expect="shape [-1, 64]"),
    Case("shape-string", EXPORT, header(_set_first("shape", "64")), expect="shape '64'"),
    Case("shape-string-dim", EXPORT, header(_set_first("shape", ["256", 64])),
         expect="non-negative ints"),
    Case("shape-bool-dim", EXPORT, header(_set_first("shape", [True, 64])),
         expect="non-negative ints"),
    Case("shape-float-dim", EXPORT, header(_set_first("shape", [256.0, 64])),
         expect="non-negative ints"),
    Case("shape-too-many-dims", EXPORT, header(_set_first("shape", [1] * 65)),
         expect="at most 64"),
    Case("shape-huge", EXPORT, header(_set_first("shape", [2**62, 2**62])),
         expect="data_offsets span"),
    Case("shape-4000-digits", EXPORT, header(_set_first("shape", [10**4000])),
         expect="needs more than the data section"),
    Case("offsets-4000-digits", EXPORT, header(_set_first("data_offsets", [0, 10**4000])),
         expect="not inside the data section"),
    Case("shape-wrong-size", EXPORT, header(_set_first("shape", [64, 64])),
         expect="data_offsets span"),
    Case("offsets-three", EXPORT, header(_set_first("data_offsets", [0, 4, 8])),
         expect="not two non-negative ints"),
    Case("offsets-negative", EXPORT, header(_set_first("data_offsets", [-4, 0])),
         expect="not two non-negative ints"),
    Case("offsets-reversed", EXPORT, header(_set_first("data_offsets", [8, 4])),
         expect="not inside the data section"),
    Case("offsets-past-end", EXPORT, header(_set_first("data_offsets", [0, 10**9])),
         expect="not inside the data section"),
    Case("offsets-overlap", EXPORT, header(_alias), expect="overlaps tensor"),
    Case("data-hole", EXPORT, header(_hole), expect="belong to no tensor"),
    Case("data-trailing-bytes", EXPORT, raw(lambda b: b + b"polyglot"),
         expect="past its last tensor"),
    Case("truncated-half", EXPORT, raw(lambda b: b[: len(b) // 2]), expect="is the file truncated"),
    Case("truncated-one-byte", EXPORT, raw(lambda b: b[:-1]), expect="is the file truncated"),
]  # fmt: skip

CASES = PATHS + HEADERS + ENTRIES


@pytest.mark.parametrize("case", cases_params(CASES))
def test_refused(case, tmp_path):
    check_case(case, tmp_path)


def test_the_undamaged_checkpoints_export(tmp_path):
    """The corpus's base checkpoints are valid: each case is refused for its damage alone."""
    for shards in (1, 2):
        root = tmp_path / str(shards)
        root.mkdir()
        write_checkpoint(root / "ck", shards)
        r = run_cli(EXPORT, root)
        assert r.returncode == 0, r.stderr
        assert "weights checkpoint ck" in r.stdout and (root / "out.onnx").is_file()
