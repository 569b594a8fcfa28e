"""What the runtime benchmarks share: their Llama and the read bandwidth of one buffer.

Imported as `benchmarks.common` by scripts run as `python benchmarks/NAME.py`, each of which
puts the checkout on sys.path first.
"""

from __future__ import annotations

from graphllm.runtime.calibrate import calibrate

# the runtime benchmark's Llama, as transformers' LlamaConfig takes it: 56M parameters, 230 MB
# in fp32, of which a decode step streams 160 MB
LLAMA_56M = {
    "vocab_size": 32000,
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
}


def read_bandwidth(nbytes: float, threads: int) -> float:
    """Read bandwidth over a buffer of `nbytes` on `threads` threads, as `graphllm calibrate`
    measures it (its other figures taken as small as they go)."""
    hw = calibrate(
        weights_bytes=nbytes,
        repeats=9,  # a read takes ~5 ms: a few more of them outlast a passing load
        threads=threads,
        progress=False,
        matmul_size=64,
        buffer_bytes=1 << 20,
    )
    return hw.extra["memory_bandwidth_model"]
