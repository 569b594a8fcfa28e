"""Progress bars on stderr for long work (an export writing GBs, a plan over hundreds of
layouts): only at a terminal and never under --json, so a log or a pipe holds no bar."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)


def showing(as_json: bool = False) -> bool:
    """Whether a bar may be drawn: stderr is a terminal and the output is not a JSON document."""
    err = sys.stderr
    return not as_json and err is not None and err.isatty()


@contextmanager
def bar(
    what: str, show: bool, in_bytes: bool = False
) -> Iterator[Callable[[int, int], None] | None]:
    """A rich bar on stderr, updated by the yielded `(done, total)` callback; None when not
    shown, so the work runs without one. `in_bytes`: done and total are bytes."""
    if not show:
        yield None
        return
    count = DownloadColumn() if in_bytes else MofNCompleteColumn()
    cols = (TextColumn(what), BarColumn(), count, TimeRemainingColumn())
    with Progress(*cols, console=Console(stderr=True), transient=True) as bars:
        task = bars.add_task(what, total=None)
        yield lambda done, total: bars.update(task, completed=done, total=total)
