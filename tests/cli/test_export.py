"""`graphllm export`: every path it would write or replace is checked before the work, and a
signal leaves no weights file that no model names."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

import graphllm.cli.export as export_cli
import graphllm.exporters.onnx.export as onnx_export
import graphllm.files as files
from graphllm.cli import main
from tests.support.paths import EXAMPLES

TINY = str(EXAMPLES / "tiny.yaml")


@pytest.fixture
def external(monkeypatch):
    """Every export's weights go to a data file beside the model, as past 2 GB."""
    monkeypatch.setattr(onnx_export, "PROTO_LIMIT", 0)


def _export(out: Path):
    return CliRunner().invoke(main, ["export", "--config", TINY, "-o", str(out)])


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _refused(r, *words: str) -> None:
    assert r.exit_code == 2, r.output
    assert r.output.count("\n") == 1 and r.output.startswith("error: "), r.output
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit)
    for w in words:
        assert w in r.output, r.output


@pytest.mark.parametrize("name", ["x.onnx.data", "x.onnx.0123abcd.data"])
def test_a_folder_where_an_earlier_weights_file_is_refused_before_the_work(
    tmp_path, external, monkeypatch, name
):
    (tmp_path / name).mkdir()
    (tmp_path / name / "kept").write_text("mine")
    built = []
    monkeypatch.setattr(export_cli, "_export_graph", lambda *a: built.append(a))
    r = _export(tmp_path / "x.onnx")
    _refused(r, f"{tmp_path / 'x.onnx'}", f"{tmp_path / name} is a folder", "move it away")
    assert not built  # refused before the graph is built, let alone its weights written
    assert _listing(tmp_path) == [name, f"{name}/kept"]


def test_the_same_folder_stops_an_export_without_external_data(tmp_path):
    (tmp_path / "x.onnx.data").mkdir()
    _refused(_export(tmp_path / "x.onnx"), "x.onnx.data is a folder")
    assert _listing(tmp_path) == ["x.onnx.data"]


def test_a_folder_at_the_model_path_is_refused(tmp_path, external):
    (tmp_path / "x.onnx").mkdir()
    _refused(_export(tmp_path / "x.onnx"), "x.onnx: it is a folder")
    assert _listing(tmp_path) == ["x.onnx"]


def test_an_unwritable_folder_is_refused():
    _refused(_export(Path("/proc/graphllm-x.onnx")), "/proc", "not writable")


def test_a_missing_folder_is_refused(tmp_path, external):
    _refused(_export(tmp_path / "none" / "x.onnx"), "does not exist")
    assert _listing(tmp_path) == []


def test_genai_and_model_explorer_check_their_files_first(tmp_path, external):
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "model.onnx.data").mkdir()
    r = CliRunner().invoke(
        main, ["export", "--config", TINY, "--format", "genai", "-o", str(tmp_path / "g")]
    )
    _refused(r, "model.onnx.data is a folder")
    (tmp_path / "m.flops.json").mkdir()  # an overlay's place
    args = [
        "export",
        "--config",
        TINY,
        "--format",
        "model-explorer",
        "-o",
        str(tmp_path / "m.json"),
    ]
    _refused(CliRunner().invoke(main, args), "m.flops.json: it is a folder")
    assert _listing(tmp_path) == ["g", "g/model.onnx.data", "m.flops.json"]


# -- a signal just after a rename -------------------------------------------------------------
def _signal_after_rename(monkeypatch, suffix: str, signum: int) -> None:
    """Send `signum` to this process just after the rename onto a name ending in `suffix`, as a
    user's Ctrl-C or a kill landing at that moment would."""
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        real(src, dst, *args, **kwargs)
        if str(dst).endswith(suffix):
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(files.os, "replace", replace)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("previous", [False, True])
def test_a_signal_after_the_data_file_is_renamed_leaves_no_unnamed_file(
    tmp_path, external, monkeypatch, signum, previous
):
    out = tmp_path / "x.onnx"
    before: list[str] = []
    if previous:
        assert _export(out).exit_code == 0
        before = _listing(tmp_path)
        old = {p: p.read_bytes() for p in tmp_path.iterdir()}
    _signal_after_rename(monkeypatch, ".data", signum)
    r = _export(out)
    assert r.exit_code == 128 + signum, r.output
    assert _listing(tmp_path) == before  # the old pair as it was, or nothing on a fresh target
    if previous:
        assert {p: p.read_bytes() for p in tmp_path.iterdir()} == old


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_after_the_model_is_renamed_still_removes_the_old_data(
    tmp_path, external, monkeypatch, signum
):
    out = tmp_path / "x.onnx"
    assert _export(out).exit_code == 0
    (old_data,) = (p.name for p in tmp_path.iterdir() if p.name.endswith(".data"))
    _signal_after_rename(monkeypatch, ".onnx", signum)
    r = _export(out)
    assert r.exit_code == 128 + signum, r.output
    names = _listing(tmp_path)
    assert old_data not in names and len(names) == 2 and "x.onnx" in names
    onnx_export.check_data_file(out)  # the new model and the data file it names
