"""Op rows of RWKV-4's WKV recurrence (transformers' RwkvForCausalLM): the weighted key-value
average over every earlier token, with its numerically stable running maximum.

The rows follow transformers' `rwkv_linear_attention` (its torch loop, the CPU fallback of the
`wkv` CUDA kernel), per batch row and channel d, with w = -exp(time_decay) and u = time_first:

  q = max(p, u + k_t)                                  the output's running maximum
  y_t = (e^(p-q) a + e^(u+k_t-q) v_t) / (e^(p-q) b + e^(u+k_t-q))
  p' = max(p + w, k_t)                                 the state's
  a' = e^(p+w-p') a + e^(k_t-p') v_t,  b' = e^(p+w-p') b + e^(k_t-p'),  p = p'

a (num), b (den) and p (max) are the state, fp32, one value a channel; without one the
recurrence starts at a = b = 0 and p = -1e38 (transformers' default). `wkv4_scan_state` starts
from a carried state (the layer's cache entries, transformers' `state[2:]`), the form a cached
step runs; `wkv4_scan` from the default, the form a call without a state runs.

FLOPs per token and channel (`wkv_flops`): 23, none a matmul (the loop multiplies and adds
elementwise, and FlopCounterMode counts none of it): the output's u + k, max, two exponentials
of differences (4), the two weighted sums (5) and the division; the state's p + w, max, two
exponentials of differences (4) and the two weighted sums (5). -exp(time_decay) is 2 a channel,
once a call. The state is read and written once, as a fused kernel does (the CUDA kernel keeps
it in registers over the tokens): the row's bytes are its inputs and outputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphllm.ir.opspec import CONTRACTION, OpSpec, register
from graphllm.ops.common import f32
from graphllm.ops.recurrent import prefix

# transformers' max state without a past: below any key
NO_MAX = -1e38

# inputs on s, outputs on t (attrs axes t), so that the tokens pass reads the prefix relation:
# key, value, time_decay, time_first [, num, den, max] -> output, num, den, max
WKV_SIG = "b s d, b s d, d, d -> b t d, b d, b d, b d"
WKV_STATE_SIG = "b s d, b s d, d, d, b d, b d, b d -> b t d, b d, b d, b d"


def _scan(xs: list[np.ndarray], a: dict[str, Any]) -> tuple[np.ndarray, ...]:
    k, v, decay, first = (f32(x) for x in xs[:4])
    bsz, t, d = k.shape
    if len(xs) > 4:
        num, den, top = (f32(x) for x in xs[4:7])
    else:
        num, den = np.zeros((bsz, d), np.float32), np.zeros((bsz, d), np.float32)
        top = np.full((bsz, d), NO_MAX, np.float32)
    w = -np.exp(decay)
    y = np.empty_like(k)
    for i in range(t):
        kt, vt = k[:, i], v[:, i]
        q = np.maximum(top, kt + first)
        e1, e2 = np.exp(top - q), np.exp(kt + first - q)
        y[:, i] = (e1 * num + e2 * vt) / (e1 * den + e2)
        q = np.maximum(top + w, kt)
        e1, e2 = np.exp(top + w - q), np.exp(kt - q)
        num, den, top = e1 * num + e2 * vt, e1 * den + e2, q
    return y, num, den, top


def wkv_flops(s: dict[str, float], a: dict[str, Any]) -> float:
    """The elementwise FLOPs of one WKV node (module docstring); it has no matmul."""
    return 23 * s["b"] * s["t"] * s["d"] + 2 * s["d"]


def _row(name: str, sig: str, doc: str, **fields: Any) -> OpSpec:
    """A WKV row: output t reads every input s <= t (prefix); nothing in it is linear, so a
    partial sum cannot pass through it."""
    return OpSpec(
        name,
        sig,
        CONTRACTION,
        _scan,
        doc,
        relation=prefix,
        matmul_flops_fn=lambda s, a: 0,
        flops_attrs_fn=wkv_flops,
        out_dtypes=("same", "fp32", "fp32", "fp32"),
        linear=(),
        backward_reads="inputs",
        **fields,
    )


register(
    _row(
        "wkv4_scan",
        WKV_SIG,
        "RWKV-4's WKV recurrence from transformers' default state (num = den = 0, max = "
        "-1e38): key, value, time_decay (w = -exp of it), time_first -> the output (the key's "
        "dtype) and the final num, den and max (fp32). 23 FLOPs per token and channel, none a "
        "matmul (module docstring).",
    ),
    _row(
        "wkv4_scan_state",
        WKV_STATE_SIG,
        "wkv4_scan from a carried state (inputs 4, 5, 6: num, den, max, the layer's cache "
        "entries): a cached step, or a prefill from the state the model starts its cache at.",
        state_inputs=(4, 5, 6),
    ),
)
