"""A device spec whose achievable (measured) rates are round figures, so that the tests of the
rate model compute the roofline's and the collectives' times by hand."""

US = 1e-6
SPEC = {
    "peak_flops": {"bf16": 1000e12, "fp32": 50e12},
    "memory_bandwidth": 4e12,
    "memory_bytes": 80e9,
    "interconnect_bandwidth": 450e9,
    "network_bandwidth": 50e9,
    "devices_per_node": 8,
    "achievable": {
        "gemm_flops": {"bf16": 800e12},
        "attention_flops": {"bf16": 600e12},
        "memory_bandwidth": 3e12,
        "interconnect": {"bus_bandwidth": 300e9, "step_latency": 2 * US},
        "network": {"bus_bandwidth": 40e9, "step_latency": 5 * US},
        "launch_seconds": 4 * US,
        "graph_launch_seconds": 1 * US,
        "graph_replay_seconds": 10 * US,
        "sm_count": 1,  # with 1x1 tiles on one SM no GEMM loses to tile or wave quantisation
        "gemm_tile": [1, 1],
        "source": "hand-made figures for the tests",
    },
}


def with_achievable(**figures: object) -> dict:
    """SPEC with these achievable figures in place of (or beside) its own."""
    return SPEC | {"achievable": SPEC["achievable"] | figures}
