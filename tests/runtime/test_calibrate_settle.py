"""calibrate's tables time a kernel only after it has run untimed for `settle` seconds (issue 20
point 5: a session just built runs at half speed for a while on the project's VMs)."""

import time

from graphllm.runtime import calibrate_tables as tables


class _Clocked:
    """A kernel of about 1 ms that records when each of its runs started."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def run(self) -> None:
        self.calls.append(time.perf_counter())
        time.sleep(0.001)

    def idle(self) -> None:
        pass


def _first_timed(settle: float, inner: int = 2, repeats: int = 3) -> float:
    k = _Clocked()
    start = time.perf_counter()
    tables._seconds(k, inner, repeats, settle)
    timed = inner * repeats
    assert len(k.calls) > timed  # one untimed run at least
    return k.calls[len(k.calls) - timed] - start


def test_no_kernel_run_is_timed_before_the_settle_has_passed():
    assert _first_timed(0.12) >= 0.12


def test_no_settle_times_after_one_untimed_run():
    assert _first_timed(0.0) < 0.05


def test_the_tables_settle_by_default():
    assert tables.SETTLE_SECONDS >= 0.05
    for table in (tables.read_sweep, tables.gemm_table, tables.attention_table):
        assert table.__defaults__[-1] == tables.SETTLE_SECONDS
