"""What this process may use, and refusing work that would need more before it starts.

Memory is the least of what the machine has free (MemAvailable), what the process's cgroup still
allows (memory.max less memory.current) and what its address-space limit leaves (RLIMIT_AS less
the current size): a buffer sized from the machine's free memory alone is killed under a
container's or `ulimit -v`'s limit instead of refused.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

from graphllm.echo import count
from graphllm.errors import GraphllmError

_UNLIMITED = 1 << 62


def _meminfo(field: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_left() -> int | None:
    """memory.max less memory.current of this process's cgroup (v2), when it has a limit."""
    try:
        rel = Path("/proc/self/cgroup").read_text().strip().split("\n")[0].split(":", 2)[2]
        folder = Path("/sys/fs/cgroup") / rel.lstrip("/")
        limit = (folder / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((folder / "memory.current").read_text()))
    except (OSError, ValueError, IndexError):
        return None


def _address_space_left() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[0])
        used = pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        used = 0
    return max(0, soft - used)


def memory_available() -> int:
    """Bytes this process can still allocate without being refused or killed."""
    figures = [_meminfo("MemAvailable"), _cgroup_left(), _address_space_left()]
    known = [f for f in figures if f is not None]
    return min(known) if known else _UNLIMITED


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def require_memory(nbytes: float, what: str, headroom: float = 0.9) -> None:
    """Refuse `what` in one line when it needs more than `headroom` of the memory left."""
    have = memory_available()
    if nbytes > headroom * have:
        raise GraphllmError(
            f"{what} needs {human_bytes(nbytes)} of memory; this process has "
            f"{human_bytes(have)} available, and graphllm leaves {1 - headroom:.0%} of it free"
        )


def require_at_most(
    value: int,
    limit: int,
    what: str,
    why: str,
    error: type[GraphllmError] = GraphllmError,
) -> None:
    """Refuse a size past a sanity limit (layers, heads, devices) in one line."""
    if value > limit:
        raise error(f"{what} is {count(value)}; graphllm takes at most {count(limit)} ({why})")
