"""A calibrated machine made up for the tests: its tables, and a local file from before them."""

MiB, GiB = 1 << 20, 1 << 30
# a cache of 32 MiB: fast up to 16 MiB, DRAM from 64 MiB on
TABLE = {
    "runtime": "made up",
    "read_bandwidth": [
        {"bytes": 64 * MiB, "bandwidth": 20e9},  # out of order on purpose: sorted on load
        {"bytes": MiB, "bandwidth": 100e9},
        {"bytes": 16 * MiB, "bandwidth": 80e9},
        {"bytes": GiB, "bandwidth": 16e9},
    ],
    "gemm": [
        {"m": 1, "k": 512, "n": 1408, "flops": 10e9},
        {"m": 128, "k": 512, "n": 1408, "flops": 50e9},
        {"m": 2048, "k": 512, "n": 1408, "flops": 90e9},
        {"m": 1, "k": 512, "n": 32000, "flops": 3e9},
        {"m": 2048, "k": 512, "n": 32000, "flops": 30e9},
    ],
    # fused attention at the tiny Llama's heads (4 heads, 2 kv heads, head_dim 16): decode at
    # two cache lengths, a prefill; and Llama-3.2-1B's at one decode step
    "attention": [
        {"heads": 4, "kv_heads": 2, "head_dim": 16, "seq": 1, "past": 63, "flops": 4e9},
        {"heads": 4, "kv_heads": 2, "head_dim": 16, "seq": 1, "past": 3, "flops": 1e9},
        {"heads": 4, "kv_heads": 2, "head_dim": 16, "seq": 128, "past": 0, "flops": 20e9},
        {"heads": 32, "kv_heads": 8, "head_dim": 64, "seq": 1, "past": 511, "flops": 9e9},
    ],
}
OLD_LOCAL = {  # a local file as calibrate wrote it before the tables
    "name": "local",
    "peak_flops": {"fp32": 44.7e9, "bf16": 44.7e9, "fp16": 44.7e9},
    "memory_bandwidth": 17.4e9,
    "memory_bytes": 25e9,
    "interconnect_bandwidth": None,
    "network_bandwidth": None,
    "devices_per_node": 1,
    "source": "graphllm calibrate 2026-12-01",
    "compute_efficiency": 1.0,
    "memory_efficiency": 1.0,
    "extra": {"matmul_size": 1024.0, "buffer_bytes": 536870912.0, "threads": 2.0},
}
