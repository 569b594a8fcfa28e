"""The rich Console every table and summary prints through.

At a terminal rich wraps to its width. Piped into a file or another program it would wrap at 80
columns (rich's default without a terminal), cutting table headers (`memory/dev…`) and folding a
plan's rows onto three lines, so there it prints at full width: a line is as long as its text.
A COLUMNS the user sets still wins, as rich reads it.
"""

from __future__ import annotations

import os

from rich.console import Console

FULL_WIDTH = 10_000  # wider than any table or line graphllm prints: nothing wraps


def console(stderr: bool = False) -> Console:
    """A Console on stdout (or stderr): the terminal's width there, full width elsewhere."""
    con = Console(stderr=stderr)
    if con.is_terminal or os.environ.get("COLUMNS"):
        return con
    return Console(stderr=stderr, width=FULL_WIDTH)
