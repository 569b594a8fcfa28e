"""Transparent huge pages for the weights a runtime holds.

Decode streams every weight once per token. numpy asks the kernel for transparent huge pages
(madvise) on its large arrays, so the read bandwidth `graphllm calibrate` measures over a numpy
buffer is a huge-page figure; onnxruntime (its prepacked MatMul weights) and torch allocate
through malloc, which does not ask, and where the kernel's THP mode is `madvise` their weights
sit on 4 KiB pages: on this project's 2-core machine that alone made decode's MatMuls 10-15%
slower than numpy reading the same bytes. MADV_COLLAPSE (Linux 6.1+) moves memory already in
place onto huge pages, whatever the THP mode: called once after the models are loaded, it gives
their weights huge pages and leaves every later allocation as it was (a process-wide malloc
setting would also madvise each step's short-lived buffers, whose faults then stall on
compaction).
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

MADV_COLLAPSE = 25  # linux/mman.h
PMD_SIZE = Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")


def huge_page_size() -> int:
    """The size of a transparent huge page here (2 MiB on x86-64 and 4 KiB-page arm64)."""
    try:
        return int(PMD_SIZE.read_text())
    except (OSError, ValueError):
        return 2 << 20


def _anonymous_regions(min_bytes: int, resident: float) -> list[tuple[int, int]]:
    """(start, end) of this process's writable anonymous mappings (and heap) of at least
    `min_bytes` that are at least `resident` in RAM: loaded weights, not reserved address space
    such as thread stacks, which a collapse would fault in whole."""
    found, current = [], None
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if not fields:
            continue
        if fields[0].endswith(":"):
            if fields[0] == "Rss:" and current is not None:
                current[2] = int(fields[1]) * 1024
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        anonymous = len(fields) < 6 or fields[5] == "[heap]"
        current = [start, end, 0] if anonymous and fields[1].startswith("rw") else None
        if current is not None:
            found.append(current)
    return [(a, b) for a, b, rss in found if b - a >= min_bytes and rss >= resident * (b - a)]


def huge_bytes() -> int:
    """Bytes of this process's anonymous memory on transparent huge pages (0 where unknown)."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def collapse(min_bytes: int = 4 << 20, resident: float = 0.9) -> int:
    """Move this process's large resident anonymous memory onto huge pages now; returns how
    many more bytes are on huge pages than before (0 where none moved: already there, not
    Linux, a kernel before 6.1, or no huge page free)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    before, huge = huge_bytes(), huge_page_size()
    for a, b in _anonymous_regions(min_bytes, resident):
        start, end = -(-a // huge) * huge, b // huge * huge
        if end > start:
            madvise(start, end - start, MADV_COLLAPSE)  # a failure leaves the pages as they were
    return max(0, huge_bytes() - before)
