"""A checkpoint's `quantization_config`, read per method into how each weight tensor is stored.

`parse_quantization(section, dtype)` turns the config.json section into a frozen `Quantization`
(ModelConfig.quantization; None for an unquantized checkpoint), and `Quantization.format_of(name,
kind)` says how one of the graph's param tensors is stored: a `QuantFormat`, or None where it is
kept at the checkpoint's own dtype (`Quantization.dtype`, its torch_dtype). The rules follow
transformers 5's quantizers (quantizers/*.py, integrations/finegrained_fp8.py, mxfp4.py) and the
formats' published packing:

- which modules a method converts:
  - `fp8` (FineGrainedFP8Config) and `compressed-tensors`: every nn.Linear and every fused
    `.experts` module. In transformers 5 every MoE router (`mlp.gate`: DeepSeek, Qwen, Mixtral) is
    a TopKRouter, not an nn.Linear, so routers stay unconverted; Qwen2-MoE's
    `shared_expert_gate` is an nn.Linear and is converted. Embeddings and norms never are.
  - `mxfp4`: the routed experts alone (replace_with_mxfp4_linear swaps the MoE's experts only).
  - `gptq` / `awq`: the nn.Linear modules inside the decoder layers (`model.layers.*`), each
    routed expert's included; routers (and Qwen2-MoE's 1-wide shared_expert_gate, whose
    qzeros could not be packed) and everything outside the layers stay unconverted.
- the skip list: `modules_to_not_convert` (fp8's `ignored_layers` is its alias, compressed-
  tensors' `ignore`) uses transformers' `should_convert_module` patterns on the module name (the
  param name without `.weight`; routed experts are one `...mlp.experts` module, as transformers 5
  fuses them): a pattern matches from the start up to a module boundary, or as a regex with the
  same boundary, or as a suffix of the name.
- the LM head: without a skip list transformers keeps the output embedding (and any tied
  weight) unconverted (get_keys_to_not_convert); a config that gives a list is taken at its word,
  so fp8 converts an `lm_head` it does not list. GPTQ converts it only with `lm_head: true`. A
  tied head is the embedding table and never converted.
- DeepSeek-V3's MTP module (which transformers does not build): its projection `eh_proj`, its
  embedding and head stay at the checkpoint's dtype, its decoder block is converted like the
  others, as the published FP8 checkpoints store them.
- a linear-attention layer (Qwen3-Next's Gated DeltaNet): in_proj_qkvz, in_proj_ba and
  out_proj are nn.Linear modules, converted like the others unless the skip list names them
  (Qwen3-Next-80B-A3B-Instruct-FP8 lists in_proj_ba); conv1d is an nn.Conv1d and A_log, dt_bias
  and the gated norm's weight are vectors: never converted. Qwen3-Next's MTP layer: mtp.fc is
  the `mtp_proj` kind (unconverted, as that checkpoint lists it), its block converted.
- biases and 1-D weights stay at the checkpoint's dtype (FP8Linear, the GPTQ/AWQ kernels keep
  bias unquantized).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from graphllm.echo import shown
from graphllm.errors import ConfigError

# kinds of the builder's params (graphllm/build) that name a matrix a Linear module holds
LINEAR_KINDS = frozenset(
    {"attention", "mlp", "shared_experts", "moe_experts", "lm_head", "mtp_proj", "router"}
)
# a linear-attention layer's matrices (Qwen3-Next's in_proj_qkvz, in_proj_ba and
# out_proj are nn.Linear modules); its conv1d is an nn.Conv1d, which no quantizer swaps
MIXER_KINDS = frozenset({"linear_attention"})
NOT_LINEAR = frozenset({"conv1d"})
# routers that are nn.Linear modules in transformers 5 (the other routers are TopKRouters)
LINEAR_ROUTERS = frozenset({"shared_expert_gate"})
INT_BITS = (4, 8)  # the GPTQ widths graphllm models (graph dtypes int4, int8)
SCALE_BITS = {"fp32": 32, "bf16": 16, "fp16": 16, "e8m0": 8}


@dataclass(frozen=True)
class QuantFormat:
    """How one weight tensor is stored: values of `value_bits` bits ('e4m3', 'e2m1' floats or
    'int'), one scale of `scale_bits` bits per `block` (rows, cols) of its [out, in] matrix (0:
    the whole axis), optionally a `zero_bits` zero point per block (packed into int32 words along
    the output axis) and GPTQ's one int32 group index per input column (`index_bits`)."""

    method: str  # 'fp8' | 'mxfp4' | 'gptq' | 'awq' | 'compressed-tensors'
    value_bits: int
    values: str  # 'e4m3' | 'e2m1' | 'int'
    block: tuple[int, int]
    scale_bits: int
    zero_bits: int = 0
    desc_act: bool = False
    scale_fmt: str = "fp32"  # one of SCALE_BITS
    index_bits: int = 0  # GPTQ's g_idx
    # the axis int values are packed along into int32 words: 'in' (GPTQ, compressed-tensors),
    # 'out' (AWQ); 'blocks': bytes per row in whole blocks, zero points packed per row to bytes
    # (onnxruntime's MatMulNBits, an export's); '' for float values, stored one per value_bits
    packed_along: str = ""
    shape_bytes: int = 0  # compressed-tensors' weight_shape tensor (two int64) per matrix
    symmetric: bool = True  # int: the zero point is the middle of the range (GPTQ `sym`)
    # GPTQ's checkpoint_format: 'gptq' (v1) stores each zero point less one, 'gptq_v2' as it is
    checkpoint_format: str = ""

    @property
    def dtype(self) -> str:
        """The graph dtype of a tensor in this format (graphllm.models.workload.DTYPES)."""
        return {"e4m3": "fp8", "e2m1": "mxfp4"}.get(self.values, f"int{self.value_bits}")

    def scales(self, rows: int, cols: int) -> int:
        """Scales (and zero points) of one [rows, cols] matrix: ceil over each block dim."""
        br, bc = self.block
        return math.ceil(rows / (br or rows)) * math.ceil(cols / (bc or cols))

    def nbytes(self, shape: Sequence[int]) -> int:
        """Bytes one tensor of `shape` ([..., out, in]; leading dims stack matrices, such as the
        experts) takes in the checkpoint: values, scales, zero points and group indices."""
        if len(shape) < 2:
            raise ConfigError(f"{self.method}: a quantized weight is a matrix, got shape {shape}")
        *lead, rows, cols = (int(s) for s in shape)
        n = math.prod(lead)
        return n * self._matrix_bytes(rows, cols)

    def _matrix_bytes(self, rows: int, cols: int) -> int:
        if self.values == "e2m1":  # MXFP4: each row in blocks of 32 values, two to a byte
            values = rows * math.ceil(cols / 32) * 16
        elif self.packed_along == "in":
            values = rows * math.ceil(cols * self.value_bits / 32) * 4
        elif self.packed_along == "out":
            values = cols * math.ceil(rows * self.value_bits / 32) * 4
        elif self.packed_along == "blocks":  # the last block padded to its full size
            values = rows * math.ceil(cols / self.block[1]) * self.block[1] * self.value_bits // 8
        else:
            values = math.ceil(rows * cols * self.value_bits / 8)
        br, bc = self.block
        s_rows, s_cols = math.ceil(rows / (br or rows)), math.ceil(cols / (bc or cols))
        scales = s_rows * s_cols * self.scale_bits // 8
        zeros = s_cols * math.ceil(s_rows * self.zero_bits / 32) * 4 if self.zero_bits else 0
        if self.packed_along == "blocks":
            zeros = s_rows * math.ceil(s_cols * self.zero_bits / 8)
        index = cols * self.index_bits // 8
        return values + scales + zeros + index + self.shape_bytes


@dataclass(frozen=True)
class Quantization:
    """A checkpoint's quantization: the format of each converted weight, what is converted, and
    the checkpoint's own dtype for the rest."""

    method: str
    weights: QuantFormat  # the stored form of every converted weight
    dtype: str = "bf16"  # torch_dtype, graphllm spelling: the unconverted tensors
    converts: str = "linear"  # 'linear' | 'experts' (mxfp4) | 'layers' (gptq/awq)
    not_converted: tuple[str, ...] = ()  # should_convert_module patterns
    default_skips: bool = True  # the skip list was not given: lm_head / tied stay unconverted
    lm_head: bool = False  # gptq's lm_head: the head is quantized too
    activation_scheme: str = ""  # fp8: 'dynamic' | 'static' activation scales

    def format_of(self, name: str, kind: str) -> QuantFormat | None:
        """How the param `name` (a graph param's checkpoint name) of builder kind `kind` is
        stored; None: unconverted, at `dtype`."""
        if kind not in LINEAR_KINDS | MIXER_KINDS or kind == "mtp_proj":
            return None
        if name.endswith(".weight"):
            module = name.removesuffix(".weight")
        elif kind == "moe_experts" and ".experts." in name and not name.endswith("_bias"):
            # gpt-oss: one `<block>.experts.<proj>` tensor per projection for all
            # experts, no `.weight`; its `<proj>_bias` stays unconverted
            module = name.rsplit(".", 1)[0]
        else:
            return None
        if ".experts.*." in module:  # one fused `experts` module in transformers 5
            module = module.split(".experts.*.", 1)[0] + ".experts"
        leaf = module.rsplit(".", 1)[-1]
        if leaf in NOT_LINEAR:
            return None
        if kind == "lm_head":
            if self.converts == "layers":
                return self.weights if self.lm_head else None
            if self.default_skips:
                return None
        if self.converts == "experts" and kind != "moe_experts":
            return None
        if kind == "router" and (self.converts == "layers" or leaf not in LINEAR_ROUTERS):
            return None
        if (
            self.converts == "layers"
            and kind != "lm_head"
            and not module.startswith("model.layers.")
        ):
            return None
        if not should_convert_module(module, self.not_converted):
            return None
        return self.weights

    def describe(self) -> str:
        """One line: the method, its values, scales and what it leaves unconverted."""
        f = self.weights
        per = {  # a later key wins: (1, 0) is a row, not a group of 0 inputs
            (1, f.block[1]): f"{f.block[1]} inputs of a row",
            (1, 0): "output row",
            (0, 0): "matrix",
        }.get(f.block, f"{f.block[0]}x{f.block[1]} block")
        zeros = f" and a {f.zero_bits}-bit zero point" if f.zero_bits else ""
        return (
            f"{self.method}: {f.value_bits}-bit {f.values} weights, one {f.scale_fmt} scale"
            f"{zeros} per {per}; the other tensors {self.dtype}"
        )


def should_convert_module(name: str, patterns: Sequence[str]) -> bool:
    """transformers' quantizers_utils.should_convert_module: False where a pattern matches `name`
    from its start up to a module boundary (also as a regex), or as its suffix."""
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    for key in patterns:
        try:
            hit = re.match(rf"(?:{key}){boundary}", name) is not None
        except re.error:
            hit = False
        if hit or name.endswith(key):
            return False
    return True


def quantization_from_fields(d: Any) -> Quantization | None:
    """A Quantization from `dataclasses.asdict`'s dict of it (read back from JSON)."""
    if d is None or isinstance(d, Quantization):
        return d
    if not isinstance(d, dict) or not isinstance(d.get("weights"), dict):
        raise ConfigError(f"quantization must be a mapping with weights, got {shown(d, 40)}")
    allowed = {f.name for f in fields(Quantization)}
    wallowed = {f.name for f in fields(QuantFormat)}
    unknown = [k for k in d if k not in allowed] + [
        f"weights.{k}" for k in d["weights"] if k not in wallowed
    ]
    if unknown:
        raise ConfigError(f"unknown config field quantization.{shown(unknown[0])}")
    w = {k: tuple(v) if isinstance(v, list) else v for k, v in d["weights"].items()}
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return Quantization(**(kw | {"weights": QuantFormat(**w)}))


# ---------------------------------------------------------------------------------------------
# Parsing config.json's section, method by method. Each method's keys are either modelled, or
# bookkeeping (calibration settings, kernel and loading choices that leave the stored tensors
# as they are); any other key, or a modelled one at a value graphllm does not model, is named.

# quant_method values transformers knows that graphllm does not model (quantization_config.py)
NOT_MODELLED = (
    "bitsandbytes", "hqq", "eetq", "torchao", "aqlm", "quanto", "vptq", "spqr", "fbgemm_fp8",
    "higgs", "bitnet", "quark", "auto-round", "fp_quant", "sinq", "metal", "mlx", "gguf",
)  # fmt: skip
_GPTQ_BOOKKEEPING = frozenset(
    {
        "damp_percent", "damp_auto_increment", "dataset", "true_sequential", "static_groups",
        "model_name_or_path", "model_file_base_name", "use_exllama", "exllama_config",
        "use_cuda_fp16", "batch_size", "pad_token_id", "cache_block_outputs", "max_input_length",
        "tokenizer", "module_name_preceding_first_block", "backend", "meta", "quantizer", "mse",
        "v2", "v2_alpha", "act_group_aware", "hyb_act", "damp",
        "disable_exllama",
        # optimum's calibration sequence length, written by Qwen's GPTQ-Int4 configs as null
        "model_seqlen",
    }
)  # fmt: skip
_AWQ_BOOKKEEPING = frozenset(
    {"backend", "do_fuse", "fuse_max_seq_len", "modules_to_fuse", "exllama_config"}
)
_CT_BOOKKEEPING = frozenset({"quantization_status", "global_compression_ratio", "version"})
_CT_WEIGHT_BOOKKEEPING = frozenset({"observer", "observer_kwargs", "zp_dtype", "scale_dtype"})


def parse_quantization(section: Any, dtype: str = "bf16") -> Quantization:
    """The `quantization_config` section of a config.json as a Quantization; `dtype` is the
    checkpoint's own (torch_dtype, graphllm spelling). A method or key graphllm does not model
    is a ConfigError naming it (every such key at once)."""
    if not isinstance(section, dict):
        raise ConfigError(f"quantization_config must be a mapping, got {shown(section, 40)}")
    method = section.get("quant_method")
    parse = _METHODS.get(method) if isinstance(method, str) else None
    if parse is None:
        why = "is not modelled" if method in NOT_MODELLED else "is unknown"
        raise ConfigError(
            f"quantization_config.quant_method {shown(method)} {why}; graphllm models "
            f"{', '.join(_METHODS)}"
        )
    return parse(_Section(f"quantization_config ({method})", section), dtype)


class _Section:
    """One method's mapping: keys read by name, the rest checked against its bookkeeping."""

    def __init__(self, where: str, d: dict) -> None:
        self.where, self.d, self.read = where, d, {"quant_method"}
        self.problems: list[str] = []

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        v = self.d.get(key)
        return default if v is None else v

    def only(self, key: str, allowed: tuple[Any, ...]) -> Any:
        """A key that graphllm models at these values alone (the first is its default)."""
        v = self.get(key, allowed[0])
        if v not in allowed:
            self.problems.append(f"{key} {_spell(v)} is not modelled (modelled: "
                                 f"{', '.join(_spell(a) for a in allowed)})")  # fmt: skip
        return v

    def done(self, bookkeeping: frozenset[str] = frozenset()) -> None:
        unknown = [k for k in self.d if k not in self.read | bookkeeping]
        problems = [f"unknown key {shown(k)}" for k in unknown] + self.problems
        if problems:
            raise ConfigError(f"{self.where}: {'; '.join(problems)}")


def _spell(v: Any) -> str:
    return shown(v, 40) if not isinstance(v, str) else repr(v)


def _two_sizes(v: Any) -> bool:
    """A [rows, cols] block: two positive integers (not bools)."""
    return (
        isinstance(v, list)
        and len(v) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in v)
    )


def _patterns(sec: _Section, *keys: str) -> tuple[tuple[str, ...], bool]:
    """The skip list under the first of `keys` present, and whether none was given."""
    for key in keys:
        v = sec.get(key)
        if v is not None:
            if not isinstance(v, list) or not all(isinstance(p, str) for p in v):
                sec.problems.append(f"{key} must be a list of module names, got {shown(v, 40)}")
                return (), False
            return tuple(v), False
    return (), True


def _fp8(sec: _Section, dtype: str) -> Quantization:
    # MiniMax-M2 spells e4m3 as torch's dtype name; FineGrainedFP8Config reads neither
    sec.only("fmt", ("e4m3", "float8_e4m3fn"))
    block = sec.get("weight_block_size")
    if block is None and "weight_block_size" in sec.d:
        rows, cols = 0, 0  # per-tensor: one scale for the whole matrix
    elif block is None:
        rows, cols = 128, 128  # FineGrainedFP8Config's default
    elif _two_sizes(block):
        rows, cols = block
    else:
        sec.problems.append(f"weight_block_size must be two positive integers, got {shown(block)}")
        rows, cols = 128, 128
    scheme = sec.only("activation_scheme", ("dynamic", "static"))
    scale = sec.only("scale_fmt", ("float", "ue8m0"))
    sec.only("expert_dtype", ("fp8",))
    sec.only("modules_to_convert", ([],))
    skip, default = _patterns(sec, "modules_to_not_convert", "ignored_layers")
    sec.get("dequantize")  # a loading choice: the stored tensors are the same
    sec.done()
    fmt = "e8m0" if scale == "ue8m0" else "fp32"
    w = QuantFormat("fp8", 8, "e4m3", (rows, cols), SCALE_BITS[fmt], scale_fmt=fmt)
    return Quantization("fp8", w, dtype, "linear", skip, default, activation_scheme=scheme)


def _mxfp4(sec: _Section, dtype: str) -> Quantization:
    skip, default = _patterns(sec, "modules_to_not_convert")
    sec.get("dequantize")
    sec.done()
    w = QuantFormat("mxfp4", 4, "e2m1", (1, 32), 8, scale_fmt="e8m0")
    return Quantization("mxfp4", w, dtype, "experts", skip, default)


def _bits_and_group(sec: _Section, allowed_bits: tuple[int, ...]) -> tuple[int, int]:
    bits = sec.get("bits")
    if bits not in allowed_bits or isinstance(bits, bool):
        sec.problems.append(
            f"bits {_spell(bits)} is not modelled (modelled: {', '.join(map(str, allowed_bits))})"
        )
        bits = allowed_bits[0]
    group = sec.get("group_size", 128)
    if not isinstance(group, int) or isinstance(group, bool) or (group < 1 and group != -1):
        sec.problems.append(f"group_size must be a positive integer or -1, got {_spell(group)}")
        group = 128
    return bits, (0 if group == -1 else group)


def _gptq(sec: _Section, dtype: str) -> Quantization:
    bits, group = _bits_and_group(sec, INT_BITS)
    sym = sec.only("sym", (True, False))
    desc = sec.only("desc_act", (False, True))
    fmt = sec.get("checkpoint_format", sec.get("format", "gptq"))
    if fmt not in ("gptq", "gptq_v2"):
        sec.problems.append(f"checkpoint_format {_spell(fmt)} is not modelled (modelled: "
                            "'gptq', 'gptq_v2')")  # fmt: skip
    sec.only("pack_dtype", ("int32",))
    sec.only("is_marlin_format", (False,))
    lm_head = sec.only("lm_head", (False, True))
    sec.only("modules_in_block_to_quantize", (None,))
    sec.only("block_name_to_quantize", (None, "model.layers"))
    sec.only("dynamic", (None, {}))
    sec.only("modules_to_not_convert", (None, []))
    sec.done(_GPTQ_BOOKKEEPING)
    w = QuantFormat(
        "gptq", bits, "int", (1, group), 16, bits, desc, "fp16", 32, "in", symmetric=sym,
        checkpoint_format=fmt,
    )  # fmt: skip
    return Quantization("gptq", w, dtype, "layers", lm_head=lm_head)


def _awq(sec: _Section, dtype: str) -> Quantization:
    bits, group = _bits_and_group(sec, (4,))
    zero = sec.only("zero_point", (True, False))
    version = sec.get("version", "gemm")
    if not isinstance(version, str) or version.lower() != "gemm":
        sec.problems.append(f"version {_spell(version)} is not modelled (modelled: 'gemm')")
    skip, _ = _patterns(sec, "modules_to_not_convert")
    sec.done(_AWQ_BOOKKEEPING)
    # WQLinear_GEMM stores qzeros whether or not zero_point is set
    w = QuantFormat("awq", bits, "int", (1, group), 16, bits, False, "fp16", 0, "out",
                    symmetric=not zero)  # fmt: skip
    return Quantization("awq", w, dtype, "layers", skip, False)


def _compressed_tensors(sec: _Section, dtype: str) -> Quantization:
    """compressed-tensors where its one config group maps onto the fp8 or int forms above."""
    fmt = sec.only("format", ("float-quantized", "pack-quantized", "int-quantized",
                              "naive-quantized"))  # fmt: skip
    sec.only("kv_cache_scheme", (None,))
    sec.only("sparsity_config", (None, {}))
    sec.only("transform_config", (None, {}))
    skip, _ = _patterns(sec, "ignore")
    g = _ct_group(sec)
    scheme = _ct_activations(g)
    g.get("format")
    q = _ct_weights(g, fmt, dtype)
    g.done()
    sec.done(_CT_BOOKKEEPING)
    return Quantization(
        "compressed-tensors", q, dtype, "linear", skip, False, activation_scheme=scheme
    )


def _ct_group(sec: _Section) -> _Section:
    """The one entry of `config_groups`, as its own section (any other count is refused)."""
    groups = sec.get("config_groups", {})
    if not isinstance(groups, dict) or len(groups) != 1:
        sec.problems.append(
            f"config_groups: graphllm models one group, got {len(groups) if isinstance(groups, dict) else shown(groups)}"
        )
        sec.done(_CT_BOOKKEEPING)
    group = next(iter(groups.values()))
    g = _Section(
        f"{sec.where}: config_groups.{next(iter(groups))}", group if isinstance(group, dict) else {}
    )
    g.read.discard("quant_method")
    g.only("targets", (["Linear"],))
    g.only("output_activations", (None,))
    return g


def _ct_activations(g: _Section) -> str:
    """The group's activation scheme: '' (none) or 'dynamic', the one quantized form modelled."""
    acts = g.get("input_activations")
    if acts is None:
        return ""
    if not isinstance(acts, dict) or acts.get("dynamic") is not True:
        g.problems.append(f"input_activations {shown(acts, 60)} is not modelled (modelled: "
                          "none, or dynamic)")  # fmt: skip
    return "dynamic"


def _ct_weights(g: _Section, fmt: str, dtype: str) -> QuantFormat:
    """The group's `weights` scheme as a QuantFormat (its scales at the checkpoint's dtype, bf16
    where that is not a scale format)."""
    wq = g.get("weights")
    if not isinstance(wq, dict):
        g.problems.append(f"weights must be a mapping, got {shown(wq, 40)}")
        wq = {}
    w = _Section(f"{g.where}.weights", wq)
    w.read.discard("quant_method")
    kind = w.only("type", ("int", "float"))
    bits = w.get("num_bits")
    sym = w.only("symmetric", (True, False))
    strategy = w.only("strategy", ("group", "channel", "tensor", "block"))
    w.only("dynamic", (False,))
    order = w.only("actorder", (None, "group", "weight", "static", "dynamic"))
    block = _ct_block(w, strategy)
    if kind == "float" and (bits != 8 or fmt != "float-quantized" or not sym):
        w.problems.append(f"float weights of {_spell(bits)} bits ({fmt}, symmetric {sym}) are "
                          "not modelled (modelled: 8-bit e4m3, float-quantized, symmetric)")  # fmt: skip
    packed = fmt == "pack-quantized"
    if kind == "int" and (bits not in ((4, 8) if packed else (8,)) or fmt == "float-quantized"):
        w.problems.append(f"int weights of {_spell(bits)} bits in {fmt} are not modelled "
                          "(modelled: 4 or 8 bits pack-quantized, 8 bits int-quantized)")  # fmt: skip
    if kind == "int" and not sym and not packed:
        w.problems.append("asymmetric int weights are modelled in pack-quantized alone")
    w.done(_CT_WEIGHT_BOOKKEEPING)
    scale_fmt = dtype if dtype in SCALE_BITS else "bf16"
    if kind == "float":
        return QuantFormat("compressed-tensors", 8, "e4m3", block, SCALE_BITS[scale_fmt],
                           scale_fmt=scale_fmt)  # fmt: skip
    return QuantFormat(
        "compressed-tensors", bits, "int", block, SCALE_BITS[scale_fmt],
        0 if sym else bits, order == "group", scale_fmt, 32 if order == "group" else 0,
        "in" if packed else "", 16 if packed else 0, sym,
    )  # fmt: skip


def _ct_block(w: _Section, strategy: Any) -> tuple[int, int]:
    """The (rows, cols) a weight scale covers under `strategy` (0: the whole axis)."""
    size = w.get("group_size")
    structure = w.get("block_structure")
    block = {"channel": (1, 0), "tensor": (0, 0)}.get(strategy, (1, size or 0))
    if strategy == "block":
        if _two_sizes(structure):
            block = (structure[0], structure[1])
        else:
            w.problems.append(
                f"block_structure must be two positive integers, got {shown(structure)}"
            )
    if strategy == "group" and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
        w.problems.append(f"group_size must be a positive integer, got {_spell(size)}")
    return block


_METHODS = {
    "fp8": _fp8,
    "mxfp4": _mxfp4,
    "gptq": _gptq,
    "awq": _awq,
    "compressed-tensors": _compressed_tensors,
}
