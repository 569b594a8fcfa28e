"""Makers of the files a fuzz `Case` needs (tests/support/hostile.py): each returns a function
that makes its file under the sandbox folder it is given."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

Make = Callable[[Path], None]


def text(name: str, body: str | bytes) -> Make:
    """A regular file holding `body` (str as UTF-8)."""

    def make(root: Path) -> None:
        (root / name).write_bytes(body if isinstance(body, bytes) else body.encode())

    return make


def fifo(name: str) -> Make:
    return lambda root: os.mkfifo(root / name)


def link(name: str, target: str | Path | Callable[[Path], str | Path]) -> Make:
    """A symlink to `target`, or to what `target(root)` gives."""

    def make(root: Path) -> None:
        (root / name).symlink_to(target(root) if callable(target) else target)

    return make


def folder(name: str, inner: Make | None = None) -> Make:
    """A folder, and what `inner` makes in it."""

    def make(root: Path) -> None:
        (root / name).mkdir()
        if inner is not None:
            inner(root / name)

    return make


def unix_socket(name: str) -> Make:
    def make(root: Path) -> None:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(root / name))  # the socket file stays after close; nobody listens
        s.close()

    return make


def both(*makes: Make) -> Make:
    """Each of `makes`, in order."""

    def make(root: Path) -> None:
        for m in makes:
            m(root)

    return make
