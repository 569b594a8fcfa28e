"""The rich Console every table and summary prints through.

At a terminal rich wraps to its width. Piped into a file or another program it would wrap at 80
columns (rich's default without a terminal), cutting table headers (`memory/dev…`) and folding a
plan's rows onto three lines, so there it prints at full width: a line is as long as its text.
A COLUMNS the user sets still wins, as rich reads it.
"""

from __future__ import annotations

import os
import signal
import sys

from rich.console import Console

FULL_WIDTH = 10_000  # wider than any table or line graphllm prints: nothing wraps


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # a reader that left (`| head`) is not an error: the exit a program killed by SIGPIPE
        # has, as the CLI gives for its own writes, not rich's exit 1
        self.quiet = True
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(128 + signal.SIGPIPE)


def console(stderr: bool = False) -> Console:
    """A Console on stdout (or stderr): the terminal's width there, full width elsewhere."""
    con = _Console(stderr=stderr)
    if con.is_terminal or os.environ.get("COLUMNS"):
        return con
    return _Console(stderr=stderr, width=FULL_WIDTH)
