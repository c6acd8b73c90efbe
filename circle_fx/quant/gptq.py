"""GPTQ (Frantar et al. 2022): a linear's weight rounded column by column onto a grid, each
column's rounding error pushed onto the columns not yet rounded, in proportion to how the
calibration inputs correlate them (the Hessian ``H = X^T X`` of the layer's squared output error).

Round-to-nearest minimises each weight's own error; what matters is the output error
``|(W - Q) X|^2``, and GPTQ's greedy column sweep with the Cholesky factor of ``H^-1`` lowers it
severalfold at 4 bits (measured on SmolLM2-135M:
``benchmarks/npu_int16_accuracy.py --only int4``).

The sweep is independent of the grid: :func:`gptq` takes a ``grid`` callable that, given the
columns of one group (the whole row for per-channel scales, 32 columns for a block format), fixes
that group's parameters and returns the rounding of one of its columns. :func:`symmetric_grid`
is the per-channel / per-group symmetric integer grid (Circle INT4 with one scale per output
row, or per block); a block format such as GGML Q4_0 supplies its own ``grid``.

Hessians come from calibration inputs: :class:`Hessian` accumulates ``X^T X`` of any number of
batches (float64). ``damp`` (a fraction of the mean diagonal added to it) keeps the inverse
stable where inputs are nearly collinear.
"""
from __future__ import annotations

from typing import Callable

import torch

#: a group's columns ``[out, g]`` -> ``round(column [out], k) -> rounded column [out]`` (k: the
#: column's position inside the group)
Grid = Callable[[torch.Tensor], Callable[[torch.Tensor, int], torch.Tensor]]


class Hessian:
    """``sum x x^T`` over the rows of every batch given to :meth:`add` (inputs ``[..., d]``)."""

    def __init__(self, d: int):
        self.h = torch.zeros(d, d, dtype=torch.float64)
        self.rows = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).double()
        self.h.addmm_(x.T, x)
        self.rows += x.shape[0]

    @property
    def mean(self) -> torch.Tensor:
        return self.h / max(self.rows, 1)


def symmetric_grid(qmin: int, qmax: int, *, search: bool = True, steps: int = 40) -> tuple[Grid, dict]:
    """A symmetric integer grid (zero point 0, values ``q * scale``, ``q`` in ``[qmin, qmax]``),
    one scale per output row of each group. ``search``: each row's scale is the one, among
    ``steps`` clipping ratios of ``max |w| / qmax`` (1 down to 0.5), with the least squared
    rounding error over the group (clipping a rare large weight buys finer steps for all the
    others; TICO's ``mse`` option); else ``max |w| / qmax``. Returns the grid and a dict that
    collects the scales of every group, in order (``scales["groups"]``: list of ``[out]``)."""
    chosen: dict = {"groups": []}

    def grid(cols: torch.Tensor):
        amax = cols.abs().amax(1).clamp(min=1e-12)
        scale = amax / qmax
        if search:
            best = torch.full_like(amax, float("inf"))
            for i in range(steps):
                s = amax * (1 - 0.5 * i / steps) / qmax
                err = ((torch.clamp(torch.round(cols / s[:, None]), qmin, qmax) * s[:, None] - cols) ** 2).sum(1)
                better = err < best
                best, scale = torch.where(better, err, best), torch.where(better, s, scale)
        chosen["groups"].append(scale)

        def round_column(col: torch.Tensor, k: int) -> torch.Tensor:
            return torch.clamp(torch.round(col / scale), qmin, qmax) * scale
        return round_column

    return grid, chosen


def gptq(weight: torch.Tensor, hessian: torch.Tensor, grid: Grid, *, group: int | None = None,
         damp: float = 0.01, act_order: bool = True, block: int = 128) -> torch.Tensor:
    """``weight`` ``[out, in]`` rounded onto ``grid`` by GPTQ with ``hessian`` ``[in, in]``
    (:class:`Hessian`'s ``h`` or ``mean``: only its shape matters, not its scale); the rounded
    weight (float32, every value on the grid).

    ``group``: columns per group of grid parameters (None: the whole row, per-channel scales).
    ``act_order``: sweep the columns by decreasing ``H`` diagonal (the inputs with the largest
    energy first, while the most columns are left to absorb their error); each group's
    parameters are then fixed from the unrounded weight before the sweep ("static groups"), so
    groups stay runs of consecutive input columns. Without it, each group's parameters come from
    its columns as the sweep reaches them (error compensation included), as in the paper.
    Columns the calibration never exercised (zero diagonal) are rounded to nearest.
    """
    w = weight.detach().double().clone()
    out, cols = w.shape
    g = cols if group is None else int(group)
    if cols % g:
        raise ValueError(f"gptq: {cols} input columns are not a multiple of the group size {g}")
    h = hessian.detach().double().clone()
    dead = torch.diagonal(h) == 0
    h[dead, dead] = 1.0
    h += torch.eye(cols, dtype=h.dtype) * (damp * torch.diagonal(h).mean())
    order = torch.argsort(torch.diagonal(h), descending=True) if act_order else torch.arange(cols)
    static = None
    if act_order:  # every group's parameters from the unrounded weight, in column order
        static = [grid(w[:, j:j + g].float()) for j in range(0, cols, g)]
    w, h = w[:, order], h[order][:, order]
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    q = torch.zeros_like(w)
    rounders: dict[int, Callable] = {}
    for b0 in range(0, cols, block):
        b1 = min(b0 + block, cols)
        wb, err = w[:, b0:b1].clone(), torch.zeros(out, b1 - b0, dtype=w.dtype)
        for i in range(b1 - b0):
            j = int(order[b0 + i])  # the column's place in the weight
            if static is not None:
                rnd = static[j // g]
            else:
                if j // g not in rounders:  # the sweep reached this group: its columns as they are now
                    cur = torch.cat([wb[:, i:], w[:, b1:]], 1)[:, :g]
                    rounders[j // g] = grid(cur.float())
                rnd = rounders[j // g]
            col = wb[:, i]
            qc = rnd(col.float(), j % g).double()
            q[:, b0 + i] = qc
            e = (col - qc) / hinv[b0 + i, b0 + i]
            wb[:, i:] -= e[:, None] * hinv[b0 + i, b0 + i:b1][None, :]
            err[:, i] = e
        w[:, b1:] -= err @ hinv[b0:b1, b1:]
    back = torch.argsort(order)
    return q[:, back].float()
