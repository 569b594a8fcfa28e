"""calibrate's tables time a kernel only after it has run untimed for `settle` seconds, and a
model's read sweep reads matrices of its own size (issue 20 point 5)."""

import inspect
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
        settle = inspect.signature(table).parameters["settle"]
        assert settle.default == tables.SETTLE_SECONDS


def test_a_models_sweep_reads_matrices_of_its_layers_mean_weight():
    from benchmarks.common import LLAMA_56M
    from graphllm.models.config import config_from_dict, load_config
    from graphllm.runtime.calibrate import sweep_side_of

    small = config_from_dict(LLAMA_56M | {"model_type": "llama"}, "small")
    # the small Llama: (2 x 512^2 + 2 x 512 x 256 + 3 x 512 x 1408) / 7 = 421302, 649^2
    assert sweep_side_of(small) == 640
    assert sweep_side_of(load_config("llama3-8b")) == 4096  # 5582, at most 4096
    count, side = tables._chain_shape(16 << 20, 320)
    assert side == 320 and count == (16 << 20) // (4 * 320 * 320)
    assert all(s % (4 * 320 * 320) == 0 for s in tables.sweep_sizes(1 << 20, 64 << 20, 320))


def test_calibrate_says_which_matrices_its_sweep_read():
    from graphllm.runtime.calibrate import QUICK, calibrate

    hw = calibrate(repeats=1, progress=False, **(QUICK | {"sweep_side": 64}))
    assert "over 64^2 weights" in hw.source
    assert all(p[0] % (4 * 64 * 64) == 0 for p in hw.calibration.read_bandwidth)
