"""Sizes as functions of the workload: B^i x (c + t*T + p*P), fitted to recordings of one model
at several (B, T, P) probes, and the graph dims they name.

A recording holds concrete sizes. Recording the same forward at probes that differ in B, T and P
and matching the recordings event by event shows which sizes follow which workload sizes: the
same size at every probe is a constant of the model, one that follows T is the new tokens,
P + T the keys, B x T the tokens flattened. A size that fits no such form (a Python branch on T
inside the model's code) is an error naming where it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np

from graphllm.errors import ConfigError

Point = tuple[int, int, int]  # (B, T, P)
# probes: pairwise distinct and prime where they can be, so no product of two of them
# equals a third; decode probes keep P > 0 and T > 1 (transformers takes other paths at T=1)
# B moves against T (2, 3, 2), so a size B x c is never also a line through the (T, size)
# points (B = 2, 3, 5 against T = 5, 7, 11 makes 4B = 2T - 2 at all three)
PREFILL_PROBES: tuple[Point, ...] = ((2, 5, 0), (3, 7, 0), (2, 11, 0))
DECODE_PROBES: tuple[Point, ...] = ((2, 3, 13), (3, 2, 17), (5, 5, 11), (3, 7, 19))


@dataclass(frozen=True, order=True)
class Expr:
    """B^b x (c + t*T + p*P)."""

    b: int
    c: int
    t: int
    p: int

    @property
    def constant(self) -> bool:
        return self.b == 0 and self.t == 0 and self.p == 0

    def value(self, batch: int, seq: int, past: int) -> int:
        return batch**self.b * (self.c + self.t * seq + self.p * past)

    @property
    def name(self) -> str:
        if self.constant:
            return str(self.c)
        if self.t == 0 and self.p == 0:
            return "B" if self.c == 1 else f"{self.c}*B"
        if self.t == 1 and self.p == 1 and self.c == 0:
            inner = "S"
        else:
            terms = [(f"{k}*{v}" if k != 1 else v) for k, v in ((self.t, "T"), (self.p, "P")) if k]
            inner = "+".join(terms).replace("+-", "-")
            if self.c:
                inner += f"{self.c:+d}"
        if self.b == 0:
            return inner or "1"
        if not inner:
            return "B"
        return f"B*{inner}" if inner.isalpha() else f"B*({inner})"


def fit(values: list[int], points: tuple[Point, ...]) -> Expr | None:
    """The simplest Expr that gives `values` at `points`, or None."""
    if len(set(values)) == 1:
        return Expr(0, values[0], 0, 0)
    pasts = {p for _, _, p in points}
    for b in (0, 1):
        w = []
        for v, (bb, _, _) in zip(values, points):
            if v % bb**b:
                break
            w.append(v // bb**b)
        else:
            for t_coef, p_coef in _linear(w, points, len(pasts) > 1):
                e = Expr(b, _const(w, points, t_coef, p_coef), t_coef, p_coef)
                if all(e.value(*pt) == v for v, pt in zip(values, points)):
                    return e
    return None


def _linear(w: list[int], points: tuple[Point, ...], with_p: bool) -> list[tuple[int, int]]:
    """Candidate integer (t, p) coefficients of w = c + t*T + p*P, by least squares."""
    cols = [[1, t] + ([p] if with_p else []) for _, t, p in points]
    sol, *_ = np.linalg.lstsq(np.array(cols, float), np.array(w, float), rcond=None)
    t, p = round(sol[1]), round(sol[2]) if with_p else 0
    return [(t + dt, p + dp) for dt, dp in product((0, -1, 1), (0, -1, 1))]


def _const(w: list[int], points: tuple[Point, ...], t: int, p: int) -> int:
    _, tt, pp = points[0]
    return w[0] - t * tt - p * pp


def fit_or_fail(values: list[int], points: tuple[Point, ...], where: str) -> Expr:
    e = fit(values, points)
    if e is None:
        shown = ", ".join(f"{v} at B={b} T={t} P={p}" for v, (b, t, p) in zip(values, points))
        raise ConfigError(
            f"{where}: a size that follows no linear rule in B, T and P ({shown}): the model's "
            "code branches on the sequence length there, so no one trace holds for every length"
        )
    return e


def fit_recordings(recs: list, points: tuple[Point, ...]) -> tuple[dict, list]:
    """(tensor -> its shape as Exprs, each event's args with every varying int an Expr) of
    recordings of one forward at `points`, which must run the same events."""
    first = recs[0]
    for rec, pt in zip(recs[1:], points[1:]):
        _same_events(first, rec, points[0], pt)
    shapes = {}
    for vid, shape in first.shapes.items():
        where = _where(first, vid)
        shapes[vid] = tuple(
            fit_or_fail([r.shapes[vid][i] for r in recs], points, where) for i in range(len(shape))
        )
    args = [
        _fit_args([r.events[i].args for r in recs], points, ev.scope or ev.op)
        for i, ev in enumerate(first.events)
    ]
    return shapes, args


def _same_events(a, b, pa: Point, pb: Point) -> None:
    if len(a.events) == len(b.events) and all(
        x.op == y.op and x.outs == y.outs for x, y in zip(a.events, b.events)
    ):
        return
    i = next(
        (n for n, (x, y) in enumerate(zip(a.events, b.events)) if x.op != y.op or x.outs != y.outs),
        min(len(a.events), len(b.events)),
    )
    where = a.events[min(i, len(a.events) - 1)].scope or "the model"
    raise ConfigError(
        f"the model's code runs different ops at B,T,P={pa} and {pb} (from op {i}, in "
        f"{where}): it branches on the sizes, so no one trace holds for every length"
    )


def _where(rec, vid: int) -> str:
    for ev in rec.events:
        if vid in ev.outs:
            return f"{ev.op} in {ev.scope or 'the model'}"
    return rec.sources.get(vid, ("a tensor", str(vid)))[1] or "a constant"


def _fit_args(versions: list, points: tuple[Point, ...], where: str):
    first = versions[0]
    if isinstance(first, tuple):
        return tuple(_fit_args([v[i] for v in versions], points, where) for i in range(len(first)))
    if isinstance(first, int) and not isinstance(first, bool):
        if all(v == first for v in versions):
            return first
        return fit_or_fail(list(versions), points, where)
    return first


def concrete(x, point: Point):
    """`x` (an Expr, or args holding them) at workload point (B, T, P)."""
    if isinstance(x, Expr):
        return x.value(*point)
    if isinstance(x, tuple):
        return tuple(concrete(v, point) for v in x)
    return x


# a length past the chunks a recurrence's torch code steps through (the chunked delta rule's
# 64, Mamba2's scan of 256): a model whose code loops or pads by chunks runs other ops there
CHECK_LENGTH = 263


def check_point(points: tuple[Point, ...], span: int | None, window: int | None) -> Point:
    """The probe the fit is checked at: a long one, inside the model's smallest window (or,
    probing past a sliding window, further past it)."""
    b, _, past = points[-1]
    if window is not None:
        return (b, 7, window + CHECK_LENGTH) if past else (b, window + CHECK_LENGTH, 0)
    room = CHECK_LENGTH if span is None else min(CHECK_LENGTH, span - 3 - (past and 7))
    if past:
        return (b, 7, max(room - 7, past + 1))
    return (b, max(room, points[-1][1] + 1), 0)


def check_fit(first, rec, shapes: dict, point: Point, fitted_at: Point) -> None:
    """The fitted sizes hold at `point` too (`rec`: the forward recorded there), or an error
    naming the first op where the model's code went another way."""
    _same_events(first, rec, fitted_at, point)
    for vid, exprs in shapes.items():
        got = rec.shapes.get(vid)
        if got is not None and tuple(e.value(*point) for e in exprs) != got:
            raise ConfigError(
                f"{_where(first, vid)}: a size follows one rule at the probes and another at "
                f"B,T,P={point} ({got}): the model's code branches on the sequence length "
                "(a loop or padding over chunks), so no one trace holds for every length"
            )
