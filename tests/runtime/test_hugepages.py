"""graphllm.hugepages: the loaded weights moved onto transparent huge pages, found by their
mappings, and nothing else touched."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys

import pytest

from graphllm.runtime import hugepages


def _malloced(nbytes: int) -> tuple[ctypes.Array, int]:
    """A buffer from malloc (not numpy, which madvises its own), every page written."""
    buf = (ctypes.c_char * nbytes)()
    ctypes.memset(buf, 1, nbytes)
    return buf, ctypes.addressof(buf)


def _fenced(nbytes: int) -> tuple[int, int]:
    """(address, mapping) of an anonymous mapping of `nbytes`, every page written, between two
    PROT_NONE pages: without them the kernel may merge it with a neighbouring mapping that an
    earlier test in this worker reserved and never wrote (seen in CI), and the merged region is
    then rightly not resident enough to be listed."""
    libc = ctypes.CDLL(None)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = 4096
    base = libc.mmap(None, nbytes + 2 * page, 3, 0x22, -1, 0)  # READ|WRITE, PRIVATE|ANONYMOUS
    libc.mprotect(ctypes.c_void_p(base), page, 0)
    libc.mprotect(ctypes.c_void_p(base + page + nbytes), page, 0)
    ctypes.memset(base + page, 1, nbytes)
    return base + page, base


def test_regions_hold_a_resident_buffer_and_skip_reserved_space():
    nbytes = 48 << 20
    at, base = _fenced(nbytes)
    regions = hugepages._anonymous_regions(4 << 20, 0.9)
    assert any(a <= at and at + nbytes <= b for a, b in regions)
    # address space reserved but never written (a thread stack, an arena) is not resident
    mmap = ctypes.CDLL(None).mmap
    mmap.restype, mmap.argtypes = (
        ctypes.c_void_p,
        [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long],
    )
    reserved = mmap(None, 64 << 20, 3, 0x22, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
    try:
        regions = hugepages._anonymous_regions(4 << 20, 0.9)
        assert not any(a <= reserved < b for a, b in regions)
    finally:
        ctypes.CDLL(None).munmap(ctypes.c_void_p(reserved), ctypes.c_size_t(64 << 20))
        ctypes.CDLL(None).munmap(ctypes.c_void_p(base), ctypes.c_size_t(nbytes + 2 * 4096))


COLLAPSE = """
import ctypes, json
from graphllm.runtime import hugepages
n = 64 << 20
buf = (ctypes.c_char * n)()
ctypes.memset(buf, 1, n)
before = hugepages.huge_bytes()
done = hugepages.collapse()
print(json.dumps([before, done, hugepages.huge_bytes(), min(buf.raw[:: 1 << 20])]))
"""


def test_collapse_moves_a_malloced_buffer_onto_huge_pages():
    # a fresh process: collapsing pytest's own memory would take seconds
    out = subprocess.run([sys.executable, "-c", COLLAPSE], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    before, done, after, least = json.loads(out.stdout)
    if done == 0:  # THP `always` put the buffer on huge pages as it was written, or no kernel
        pytest.skip("nothing to move onto huge pages here (THP always, or no MADV_COLLAPSE)")
    # at least the buffer's whole huge pages, and its contents unchanged
    assert done == after - before >= (64 << 20) - 2 * hugepages.huge_page_size()
    assert least == 1
