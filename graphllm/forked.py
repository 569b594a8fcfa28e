"""Independent pieces of work spread over forked worker processes, results in order.

A plan partitions and analyses a rank program for each of a hundred or more layouts, each piece
pure and a few milliseconds long: on a machine with more than one core they run side by side.
Workers are forked, so they read what the parent built (copy-on-write) and nothing is pickled
but each piece's key and result. Where fork is not available, the pieces are few, or
$GRAPHLLM_JOBS is 1, they run here, one after the other; the results are the same either way.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import multiprocessing as mp
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from graphllm.echo import shown
from graphllm.errors import ConfigError

JOBS_ENV = "GRAPHLLM_JOBS"


def workers(pieces: int, least: int) -> int:
    """Worker processes for `pieces` pieces of work: 1 below `least` pieces or without fork,
    else the cores this process may run on, at most $GRAPHLLM_JOBS and one a piece."""
    cap = _cap()
    if pieces < least or cap == 1 or "fork" not in mp.get_all_start_methods():
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, pieces, cap or cores))


def _cap() -> int | None:
    raw = os.environ.get(JOBS_ENV)
    if raw is None or raw == "":
        return None
    n = int(raw) if raw.isascii() and raw.isdigit() else 0
    if n < 1:
        raise ConfigError(f"${JOBS_ENV} must be a positive integer, got {shown(raw)}")
    return n


_QUIETED = {signal.SIGINT, signal.SIGHUP, signal.SIGTERM}
_PARENT = 0  # the process that forks the workers (a worker checks it still has it)


def _quiet_worker() -> None:
    """A worker leaves a Ctrl-C or a hang-up of its terminal's process group to the parent,
    which stops the workers as it unwinds (the CLI's handlers, forked with it, would raise in
    the worker too); a SIGTERM ends it at once. It is forked with these signals held, and
    takes them once its handlers are set."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # a parent killed outright (SIGKILL, the OOM killer) does not stop its workers, which wait
    # on a queue whose write end they hold themselves: the kernel ends them with it
    _end_with_parent()
    if os.getppid() != _PARENT:  # it died before the line above
        os._exit(1)
    # nothing a worker writes is read; and the parent's stream, whose lock another thread (a
    # progress bar) may have held as the worker forked, is flushed as a worker exits
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the worker's own, to its end
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _QUIETED)


def _end_with_parent() -> None:
    """Linux's PR_SET_PDEATHSIG: SIGTERM this process when its parent dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: the parent's unwinding stops the workers
        pass


def ordered_map(fn: Callable[[Any], Any], items: Iterable[Any], jobs: int) -> Iterator[Any]:
    """fn(item) for each item, in order: over `jobs` forked workers, or here when jobs is 1.
    `fn` must be a module-level function (its name is what a worker is sent). A worker that
    dies (killed for memory) leaves the rest to this process."""
    items = list(items)
    if jobs <= 1:
        yield from map(fn, items)
        return
    global _PARENT
    _PARENT = os.getpid()
    pool = cf.ProcessPoolExecutor(
        jobs,
        mp_context=mp.get_context("fork"),
        initializer=_quiet_worker,
    )
    done = 0
    try:
        # the first submit forks the workers: signals wait until each has set its own handlers
        # (one arriving in between would run the parent's handler in the worker)
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _QUIETED)
        try:
            futures = [pool.submit(fn, items[0])] if items else []
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        futures += [pool.submit(fn, x) for x in items[1:]]
        for f in futures:
            try:
                result = f.result()
            except BrokenProcessPool:
                break
            yield result
            done += 1
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    yield from map(fn, items[done:])
