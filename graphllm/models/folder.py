"""Files a checkpoint folder names, found without leaving the folder.

A checkpoint comes from someone else: its index names shard files and its folder may hold
symlinks, and neither may make graphllm read a file outside the folder, or block on a FIFO or a
device. A member is a relative name without `..`, whose resolved path (symlinks followed) lies
inside the resolved folder and is a regular file.

One exception keeps the Hugging Face hub cache working: a snapshot folder
(`models--org--name/snapshots/REV/`) holds symlinks into the same repository's `blobs/` folder,
which the hub client wrote from the same download, so that folder counts as inside too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

from graphllm.echo import shown
from graphllm.errors import GraphllmError
from graphllm.models.parse import file_kind


def folder_roots(folder: Path) -> list[Path]:
    """The resolved folders a member of `folder` may lie in (see the module's note)."""
    root = folder.resolve()
    roots = [root]
    repo = root.parent.parent
    if root.parent.name == "snapshots" and repo.name.startswith("models--"):
        blobs = repo / "blobs"
        if blobs.is_dir() and not blobs.is_symlink():
            roots.append(blobs)
    return roots


def folder_member(
    folder: Path, name: object, what: str, error: type[GraphllmError] = GraphllmError
) -> Path:
    """The resolved path of file `name` in checkpoint `folder`, or `error` in one line naming
    `what` (where the name came from) when it is not a regular file inside the folder."""
    if not isinstance(name, str):
        raise error(f"{what}: a file name must be a string, got {shown(name)}")
    pure = PurePosixPath(name)
    if not name or "\x00" in name or pure.is_absolute() or "\\" in name:
        raise error(f"{what}: {shown(name)} is not a file name relative to the folder")
    if ".." in pure.parts:
        raise error(f"{what}: {shown(name)} climbs out of the folder with '..'")
    try:
        path = (folder / name).resolve()
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop on Python < 3.13
        raise error(f"{what}: {shown(name)} cannot be resolved: {e}") from None
    if not any(path.is_relative_to(root) for root in folder_roots(folder)):
        raise error(f"{what}: {shown(name)} points outside the folder (through a symlink)")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise error(f"{what}: {shown(name)} does not exist") from None
    except OSError as e:
        raise error(f"{what}: {shown(name)} cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        raise error(f"{what}: {shown(name)} is {file_kind(mode)}, not a regular file")
    return path
