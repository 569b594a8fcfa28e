"""What `export_onnx(quantize=...)` and `graphllm export --quantize` take: the settings of
onnxruntime's com.microsoft `MatMulNBits` (graphllm.exporters.onnx.quantize makes the weights
and nodes). Below the lowering context, which carries them."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from graphllm.errors import ConfigError

MS_DOMAIN = "com.microsoft"
BITS = {"int4": 4, "int8": 8}
BLOCK_SIZES = (32, 64, 128)
ACCURACY_LEVELS = (0, 1, 4)  # 0/1: fp32 compute; 4: activations quantized to int8 per block


@dataclass(frozen=True)
class Quantization:
    """Weight-only quantization of the exported MatMuls."""

    method: str = "int4"
    block_size: int = 32
    accuracy_level: int = 4
    symmetric: bool = False

    def __post_init__(self) -> None:
        bad = []
        if self.method not in BITS:
            bad.append(f"method {self.method!r} (int4 or int8)")
        if self.block_size not in BLOCK_SIZES:
            bad.append(f"block size {self.block_size} ({', '.join(map(str, BLOCK_SIZES))})")
        if self.accuracy_level not in ACCURACY_LEVELS:
            levels = ", ".join(map(str, ACCURACY_LEVELS))
            bad.append(f"accuracy level {self.accuracy_level} ({levels})")
        if bad:
            raise ConfigError(f"cannot quantize with {'; '.join(bad)}")

    @property
    def bits(self) -> int:
        return BITS[self.method]

    def to_dict(self) -> dict:
        """What the export's metadata records (`graphllm.quantization`)."""
        return {
            **asdict(self),
            "op": f"{MS_DOMAIN}.MatMulNBits",
            "bits": self.bits,
            "float": "embeddings, norms and routed experts (stacked: MatMulNBits is 2-D)",
        }
