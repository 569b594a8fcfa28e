"""User values as an error line may echo them: shortened, on one line, and never costly.

An error names the value it refuses, but the value came from a file anyone can write: a 100 MB
string, a 4000-digit integer (whose repr Python itself refuses past 4300 digits), a list nested
900 deep. `shown` gives a repr of at most `limit` characters for any of them, in time and memory
bounded by the limit, not by the value.
"""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

SHOWN_CHARS = 60  # a value's repr in an error line
PATH_CHARS = 160  # a file's path in an error line: its folder is cut, its name kept


class _ShortRepr(reprlib.Repr):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxstring = self.maxother = self.maxlong = limit
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = 6

    def repr_int(self, x: int, level: int) -> str:
        # repr() of an int past sys.get_int_max_str_digits() raises: it is named by its digits
        if abs(x) >= 10**30:
            return count(x)
        return super().repr_int(x, level)

    def repr_str(self, x: str, level: int) -> str:
        if len(x) <= self.maxstring:
            return super().repr_str(x, level)
        # a long string is named by its start and its length, which is what the reader can use
        return f"{cut(repr(x[: self.maxstring // 2]), self.maxstring)}... ({len(x):,} characters)"

    def repr_instance(self, x: Any, level: int) -> str:
        try:
            return cut(repr(x), self.maxother)
        except Exception:  # a value whose repr fails is still named by its type
            return f"<{type(x).__name__}>"


def cut(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text` on one line, cut to at most `limit` characters with '...' where it was cut."""
    text = text[: limit * 4]  # bounds the work below on a 100 MB string
    one_line = " ".join(text.split()) if any(c in text for c in "\n\r\t\v\f") else text
    return one_line if len(one_line) <= limit else one_line[: max(limit - 3, 1)] + "..."


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """`value`'s repr, shortened to about `limit` characters (a long string keeps its length)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return count(value)  # with separators: a size is read by its magnitude
    if isinstance(value, str) and len(value) > limit:
        return _ShortRepr(limit).repr_str(value, 0)
    try:
        return cut(_ShortRepr(limit).repr(value), limit)
    except RecursionError:
        return f"<a deeply nested {type(value).__name__}>"


def shown_path(path: str | Path, limit: int = PATH_CHARS) -> str:
    """A path for an error line: whole when short, else '...' and its last `limit` characters."""
    text = str(path)
    if len(text) > limit:
        text = text[-limit:]
    if not text.isprintable():  # a newline or NUL in a name would break the line or hide
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit and len(str(path)) <= limit else "..." + text[-(limit - 3) :]


def count(value: int) -> str:
    """An integer as a message shows it: with thousands separators, or its number of digits when
    it has too many to print (str() itself refuses past 4300 digits)."""
    if abs(value) < 10**30:
        return f"{value:,}"
    digits = int((abs(value).bit_length() - 1) * 0.30102999566398) + 1  # at most one short
    digits += abs(value) >= 10**digits
    return f"a {digits}-digit {'negative ' if value < 0 else ''}number"
