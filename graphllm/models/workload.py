"""What the model is asked to compute: batch, new tokens, past tokens, and the dtypes of storage."""

from __future__ import annotations

from dataclasses import InitVar, asdict, dataclass

from graphllm.echo import shown
from graphllm.errors import ConfigError
from graphllm.limits import require_at_most

# Sanity limits of a workload, checked before any graph is built. Positions (S = P + T): 2**24,
# past the longest published context window (10M tokens, Llama 4 Scout). Batch: 2**24 sequences.
# Positions in flight (B x S, the rows of the KV cache and of every activation): 2**30, 16x the
# largest published training batch (about 63M tokens a step, DeepSeek-V3). Query-key pairs
# (B x T x S, the score matrices): 2**48, a 16M-token prefill at batch 1; times any published
# model's heads x head_dim (<= 2**14) one layer's attention FLOPs stay within int64, where ONNX
# shapes and numpy index arithmetic live.
MAX_POSITIONS = 1 << 24
MAX_BATCH = 1 << 24
MAX_TOKENS = 1 << 30
MAX_PAIRS = 1 << 48
FLAGS = {"batch": "--batch", "seq_len": "--seq-len", "past_len": "--past-len"}
# how an analysis counts core attention, named beside the workload in every document: fused
# (flash: the score matrix never leaves the chip) or every op through memory (naive)
ATTENTION_FORMS = ("flash", "naive")


@dataclass(frozen=True)
class DType:
    """A storage dtype. `bits` per element; weight-only int formats add one scale per group."""

    name: str
    bits: int
    group_size: int = 0  # elements sharing one scale (0: no scales)
    scale_bits: int = 0

    def nbytes(self, numel: float) -> float:
        """Bytes to store `numel` elements, scales included."""
        b = numel * self.bits / 8
        if self.group_size:
            b += numel / self.group_size * self.scale_bits / 8
        return b


DTYPES: dict[str, DType] = {
    "fp64": DType("fp64", 64),
    "fp32": DType("fp32", 32),
    "bf16": DType("bf16", 16),
    "fp16": DType("fp16", 16),
    "fp8": DType("fp8", 8),
    "int8": DType("int8", 8),
    # int4 weights in groups of 128 with an fp16 scale each, as GPTQ/AWQ store them
    "int4": DType("int4", 4, group_size=128, scale_bits=16),
    # e2m1 values in blocks of 32 with one e8m0 exponent byte each (gpt-oss's experts)
    "mxfp4": DType("mxfp4", 4, group_size=32, scale_bits=8),
    # torch's tinygemm layout (aten._weight_int4pack_mm, as gpt-fast's quantize.py
    # --mode int4 --groupsize 32 stores it): int4 in groups of 32 with a bf16 scale and a bf16
    # zero point each, 32 bits of scales per group
    "int4g32": DType("int4g32", 4, group_size=32, scale_bits=32),
}
# dtypes that only make sense for stored weights (activations need a float format)
WEIGHT_ONLY = {"int4", "mxfp4", "int4g32"}
# dtypes some ops of a traced model compute in (Ergo's float64 RoPE angles), never a workload's
OPS_ONLY = {"fp64"}
# activation dtypes that are a GEMM's quantized input (W8A8), not a stream's: FP8 and int8
# engines (TensorRT-LLM, vLLM, SGLang) quantize a linear's input and keep the residual stream,
# the norms, the attention's inputs and the collectives in 16 bits
GEMM_ONLY_ACTIVATIONS = {"fp8", "int8"}
STREAM_DTYPE = "bf16"  # the stream's dtype beside GEMM_ONLY_ACTIVATIONS


def stream_of(act_dtype: str) -> str:
    """The dtype held between ops for an activation dtype: 16-bit beside a W8A8 one."""
    return STREAM_DTYPE if act_dtype in GEMM_ONLY_ACTIVATIONS else act_dtype


# spellings seen in HF configs
DTYPE_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
}


def _dtype(name: str) -> DType:
    """Look up a dtype by graphllm or torch spelling."""
    key = DTYPE_ALIASES.get(name, name) if isinstance(name, str) else None
    if key not in DTYPES:
        raise ConfigError(f"unknown dtype {shown(name)}; known: {', '.join(DTYPES)}")
    return DTYPES[key]


@dataclass(frozen=True)
class Workload:
    """Batch B, new tokens T, past tokens P (KV cache); key length S = P + T.

    P > 0 with small T is decode. Dtypes drive bytes and memory; execution is fp32.
    """

    batch: int = 1
    seq_len: int = 1
    past_len: int = 0
    weight_dtype: str = "bf16"
    act_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    # 'all': logits for every new position; 'last': only the last one, as a server computes them
    logits: str = "all"
    # sets all three dtypes at once (an int4 one keeps 16-bit activations and cache)
    dtype: InitVar[str | None] = None

    def __post_init__(self, dtype: str | None) -> None:
        if dtype is not None:
            canon = _dtype(dtype).name
            other = "fp16" if canon in WEIGHT_ONLY else canon
            object.__setattr__(self, "weight_dtype", canon)
            object.__setattr__(self, "act_dtype", other)
            object.__setattr__(self, "kv_dtype", other)
        _check_count(self, "batch", 1)
        _check_count(self, "seq_len", 1)
        _check_count(self, "past_len", 0)
        _check_sizes(self)
        if self.logits not in ("all", "last"):
            raise ConfigError(f"workload logits must be 'all' or 'last', got {shown(self.logits)}")
        for name in ("weight_dtype", "act_dtype", "kv_dtype"):
            canon = _dtype(getattr(self, name)).name
            if canon in WEIGHT_ONLY and name != "weight_dtype":
                raise ConfigError(f"{canon} is a weight-only format; it cannot be the {name}")
            if canon in OPS_ONLY:
                raise ConfigError(f"{canon} is a dtype of a model's own ops, not a workload's")
            object.__setattr__(self, name, canon)

    @property
    def stream_dtype(self) -> str:
        """The dtype the activations between ops are held in: `act_dtype`, or 16-bit when that
        is a GEMM-only (W8A8) activation dtype (GEMM_ONLY_ACTIVATIONS)."""
        return stream_of(self.act_dtype)

    @property
    def key_len(self) -> int:
        return self.past_len + self.seq_len

    @property
    def phase(self) -> str:
        return "decode" if self.past_len > 0 else "prefill"

    def bindings(self) -> dict[str, int]:
        """Values of the symbolic dims B, T, P, S."""
        return {"B": self.batch, "T": self.seq_len, "P": self.past_len, "S": self.key_len}

    def to_dict(self) -> dict:
        return asdict(self) | {
            "key_len": self.key_len,
            "phase": self.phase,
            "stream_dtype": self.stream_dtype,
        }

    @staticmethod
    def with_dtype(base: Workload | None = None, **kw: object) -> Workload:
        """`base` (or the defaults) with `dtype=` setting all three dtypes, then per-kind overrides."""
        d = asdict(base or Workload())
        all_dt = kw.pop("dtype", None)
        if all_dt is not None:
            full = Workload(dtype=all_dt)  # type: ignore[arg-type]
            d.update(
                weight_dtype=full.weight_dtype, act_dtype=full.act_dtype, kv_dtype=full.kv_dtype
            )
        d.update({k: v for k, v in kw.items() if v is not None})
        return Workload(**d)


def _check_count(wl: Workload, name: str, least: int) -> None:
    """An integer of at least `least` (not a bool, a float or a string that looks like one)."""
    v = getattr(wl, name)
    if not isinstance(v, int) or isinstance(v, bool) or v < least:
        kind = "a positive integer" if least else "a non-negative integer"
        raise ConfigError(f"workload {name} must be {kind}, got {shown(v)}")


def _check_sizes(wl: Workload) -> None:
    """The sanity limits above, one field or product at a time, the first broken one named."""
    why_positions = "past the longest published context window, 10M tokens"
    for name in ("batch", "seq_len", "past_len"):
        limit = MAX_BATCH if name == "batch" else MAX_POSITIONS
        why = "sequences in one batch" if name == "batch" else why_positions
        require_at_most(
            getattr(wl, name), limit, f"workload {name} ({FLAGS[name]})", why, ConfigError
        )
    s = wl.past_len + wl.seq_len
    require_at_most(
        s, MAX_POSITIONS, "the key length past_len + seq_len", why_positions, ConfigError
    )
    require_at_most(
        wl.batch * s,
        MAX_TOKENS,
        "batch x key length (positions the KV cache and activations hold)",
        "16x the largest published training batch",
        ConfigError,
    )
    require_at_most(
        wl.batch * wl.seq_len * s,
        MAX_PAIRS,
        "batch x seq_len x key length (query-key pairs of the score matrices)",
        "attention FLOP counts stay inside int64",
        ConfigError,
    )


# bytes per element of the integer dtypes a graph's tensors may have beside DTYPES
INTEGER_BYTES = {"int64": 8, "int32": 4, "bool": 1}
dtype = _dtype  # public name: look up a dtype by graphllm or torch spelling


def nbytes(dtype_name: str, numel: float) -> float:
    """Bytes of `numel` elements of a graph tensor: a storage dtype, or an integer one (token
    ids; a traced model's indices and boolean masks)."""
    whole = INTEGER_BYTES.get(dtype_name)
    return whole * numel if whole is not None else _dtype(dtype_name).nbytes(numel)
