"""Output files are written whole or not at all: to a temporary file beside them, then renamed.

A temporary's name carries its writer's PID (`.NAME.<pid>.<8 hex>.tmp`), so that the next run
writing to the same target removes those a killed writer left (SIGKILL runs no cleanup) and
leaves those of a writer still running. A target that exists and is not a regular file (a
device, a FIFO, a symlink to one) is refused: renaming over it would replace the device node.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

from graphllm.echo import shown_path
from graphllm.errors import GraphllmError

_TMP = re.compile(r"\.(\d+)\.[0-9a-f]{8}\.tmp$")
_OVERHEAD = 1 + 1 + 10 + 1 + 8 + 4  # the dot, `.<pid>.<8 hex>.tmp`
_KINDS = {
    stat.S_ISCHR: "a character device",
    stat.S_ISBLK: "a block device",
    stat.S_ISFIFO: "a FIFO",
    stat.S_ISSOCK: "a socket",
    stat.S_ISDIR: "a folder",
}


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


# the files and checkpoint folders this process read its inputs from: an output never replaces
# one (`export --config t.yaml -o t.yaml` would lose the config, `-o ck/model.safetensors` the
# checkpoint)
_INPUTS: list[Path] = []


def note_input(path: str | Path) -> None:
    """Record `path` (a file, or a checkpoint folder: everything in it) as an input."""
    with contextlib.suppress(OSError, RuntimeError, ValueError):  # unresolvable: not read
        _INPUTS.append(Path(path).resolve())


def forget_inputs() -> None:
    _INPUTS.clear()


def _input_replaced(path: Path, inputs: tuple) -> Path | None:
    """The input (a file or a folder holding it) that writing `path` would replace, if any."""
    if not path.exists():
        return None
    target = path.resolve()
    for src in [*_INPUTS, *(Path(p).resolve() for p in inputs if p is not None)]:
        try:
            if target == src or (src.is_dir() and target.is_relative_to(src)):
                return src
            if src.is_file() and os.path.samefile(target, src):  # a hard link to it
                return src
        except OSError:
            continue
    return None


def check_target(path: str | Path, inputs: tuple = ()) -> Path:
    """`path` as a place a new regular file can be moved to, or a GraphllmError naming why not:
    its folder missing or not a folder, its name too long, it being something other than a
    regular file (followed through symlinks), or it being one of the command's inputs (those
    noted with `note_input`, and `inputs`)."""
    path = Path(path)
    folder = path.parent
    if str(path) == ".":  # what an empty name becomes
        raise GraphllmError("cannot write '.': give a file name, not an empty one or a folder")
    if "\0" in str(path):
        raise GraphllmError(f"cannot write {shown_path(path)}: the name holds a NUL byte")
    if not folder.exists():
        raise GraphllmError(
            f"cannot write {shown_path(path)}: folder {shown_path(folder)} does not exist"
        )
    if not folder.is_dir():
        raise GraphllmError(
            f"cannot write {shown_path(path)}: {shown_path(folder)} is not a folder"
        )
    longest = _name_max(folder)
    if len(os.fsencode(path.name)) > longest:
        raise GraphllmError(
            f"cannot write {shown_path(path)}: its name is {len(os.fsencode(path.name))} bytes; "
            f"the file system takes at most {longest}"
        )
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        mode = None  # nothing there, or a dangling symlink (which the rename replaces)
    except OSError as e:
        raise GraphllmError(f"cannot write {shown_path(path)}: {e.strerror}") from None
    if mode is not None and not stat.S_ISREG(mode):
        kind = next((k for test, k in _KINDS.items() if test(mode)), "not a regular file")
        link = " (through a symlink)" if path.is_symlink() else ""
        raise GraphllmError(
            f"cannot write {shown_path(path)}: it is {kind}{link}, not a regular file; "
            f"graphllm only replaces regular files"
        )
    source = _input_replaced(path, inputs) if mode is not None else None
    if source is not None:
        inside = "" if source == path.resolve() else f", in {shown_path(source)}"
        raise GraphllmError(
            f"cannot write {shown_path(path)}: it is one of this command's inputs{inside}"
        )
    problem = _unwritable(folder)
    if problem is not None:
        raise GraphllmError(f"cannot write {shown_path(path)}: {problem}")
    return path


def temp_path(path: Path) -> Path:
    """A fresh temporary name beside `path`, carrying this process's PID."""
    room = _name_max(path.parent) - _OVERHEAD
    stem = os.fsdecode(os.fsencode(path.name)[:room]) if room > 0 else ""
    return path.with_name(f".{stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's process, or a PID past the range: not ours to judge
    return True


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporaries beside `path` that a writer now dead left: those named
    `.NAME....<pid>.<hex>.tmp` for NAME `path`'s name (or its data files' names)."""
    room = _name_max(path.parent) - _OVERHEAD
    prefix = "." + os.fsdecode(os.fsencode(path.name)[:room])
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for entry in entries:
        match = _TMP.search(entry.name)
        if not entry.name.startswith(prefix) or match is None or pid_alive(int(match[1])):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
            removed.append(Path(entry.path))
        except OSError:
            pass
    return removed


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems do not sync folders; the rename still happened
    finally:
        os.close(fd)


def _mode_of_new_file() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomic(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` on a temporary path in the target folder, then move it into place.
    On any error or interruption (an `Interrupted` from a signal) the temporary is removed and
    the old target, if any, is left as it was."""
    path = check_target(path)
    remove_stale_temporaries(path)
    tmp = temp_path(path)
    try:
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            write(tmp)
            os.chmod(tmp, _mode_of_new_file())  # made private; give it a normal file's mode
            fsync_file(tmp)
            check_target(path)  # a device put there while writing is not replaced either
            os.replace(tmp, path)
        except OSError as e:
            raise GraphllmError(f"cannot write {shown_path(path)}: {e.strerror or e}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_atomic(path, lambda p: p.write_text(text))


@contextmanager
def temporary_folder(prefix: str) -> Iterator[Path]:
    """A private folder under $TMPDIR named with this PID, removed on the way out (errors and
    signals included); those a killed run left are removed first."""
    root = Path(tempfile.gettempdir())
    if not root.is_dir():
        raise GraphllmError(f"the temporary folder {shown_path(root)} does not exist (TMPDIR)")
    remove_stale_temporaries(root / prefix)
    folder = temp_path(root / prefix)
    try:
        folder.mkdir(mode=0o700)
    except OSError as e:
        raise GraphllmError(
            f"cannot make a temporary folder in {shown_path(root)}: {e.strerror}"
        ) from None
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def folder_problem(folder: Path) -> str | None:
    """Why `folder` cannot be made (or written to), without making it: an ancestor that is a
    file, or a read-only file system; None when it can."""
    for existing in (folder, *folder.parents):
        if not existing.exists():
            continue
        if not existing.is_dir():
            return f"{shown_path(existing)} is not a folder"
        return _unwritable(existing)
    return None


def _unwritable(folder: Path) -> str | None:
    """Why no file can be made in `folder` (tried: root passes every permission check, and
    /proc or a read-only mount refuse only the attempt), or None."""
    probe = temp_path(folder / "graphllm-probe")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as e:
        return f"{shown_path(folder)} is not writable ({e.strerror})"
    os.unlink(probe)
    return None


def make_folder(folder: Path, what: str) -> Path:
    """`folder` and its parents, or one line saying why `what` cannot go there."""
    problem = folder_problem(folder)
    if problem is None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            return folder
        except OSError as e:
            problem = e.strerror or str(e)
    raise GraphllmError(f"cannot write {what} under {shown_path(folder)}: {problem}")


def finite(doc: Any) -> Any:
    """`doc` with every NaN and infinity replaced by None (JSON's null). An exact count kept as
    a Fraction (balanced MoE routing's B*T*k/E slots on one rank) is written as an int when it
    is whole and as the nearest float when it is an expectation."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, Fraction):
        return int(doc) if doc.denominator == 1 else float(doc)
    if isinstance(doc, dict):
        return {k: finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [finite(v) for v in doc]
    return doc


def json_text(doc: Any, indent: int | None = None) -> str:
    """`doc` as strict JSON: non-finite numbers become null, never `NaN` or `Infinity`."""
    return json.dumps(finite(doc), indent=indent, allow_nan=False)
