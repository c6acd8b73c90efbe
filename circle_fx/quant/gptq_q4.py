"""GPTQ inside GGML Q4_0's block grid: each linear's rounding chosen against its calibration inputs.

The importance-weighted scale search (:mod:`circle_fx.quant.ggml`) rounds every weight to the
nearest level of the best scale of its block; the output error ``(W - Q) x`` still adds up the
rounding errors of correlated input columns. GPTQ (Frantar et al. 2022, the sweep of
:func:`circle_fx.quant.gptq.gptq`) rounds the columns in order and pushes each column's error onto
the columns not yet rounded, in proportion to how the calibration inputs correlate them (the
Hessian ``H = E[x x^T]`` of the layer's squared output error). Here the grid is Q4_0's: when the
sweep reaches a block of 32 input columns, every row's scale ``d`` is chosen by the same
importance-weighted search as the plain path (weights ``diag H = E[x_j^2]``) on the columns *as the
sweep has updated them*, then each column is rounded ``clip(trunc(x / d + 8.5), 0, 15)`` exactly as
the packer codes it. The result is a weight on the grid plus its scales, which
``ggml.pack(..., scales=)`` packs bit for bit.

:func:`gptq_q4_0_rounding` runs it for every Q4_0-able linear of a model: forward pre-hooks
accumulate ``x x^T`` of each linear input (one Hessian per input tensor: q/k/v, gate/up share
theirs), a few layers at a time so the Hessians stay within ``HESSIAN_BUDGET`` bytes (one more
forward per chunk), and the packed blocks are kept (keyed by parameter name, with a fingerprint of
the weight they were computed from: :class:`Rounding`). The export then packs those blocks instead
of searching (``Importance.rounding``), unless the weight it packs is no longer the one calibrated
(a fusion or SmoothQuant changed it): the fingerprint then disagrees and the plain weighted search
runs.
"""
from __future__ import annotations

import re
import time

import numpy as np
import torch
from torch import nn

from ..circle.ggml import BLOCK, Q4_0

#: float32 bytes of Hessians held at once (the model runs once more per chunk of layers beyond it)
HESSIAN_BUDGET = 512 << 20
#: GPTQ's damping: this fraction of the mean diagonal added to H (keeps H^-1 stable)
DAMP = 0.01


def fingerprint(w: torch.Tensor) -> np.ndarray:
    """Per-row float64 sums of ``|w|`` (a merged weight's rows are its parts' rows in order)."""
    from ..program import row_chunks

    out = []
    with torch.no_grad():
        for _, part in row_chunks(w, max(1, (1 << 20) // max(1, w.shape[-1]))):
            out.append(part.to(torch.float64).abs().sum(-1).numpy())
    return np.concatenate(out)


class Rounding:
    """GPTQ's packed Q4_0 blocks per weight name: ``{name: (blocks uint8 [rows, bytes], fingerprint)}``."""

    def __init__(self):
        self.blocks: dict[str, tuple[torch.Tensor, np.ndarray]] = {}
        self.seconds = 0.0

    def __len__(self):
        return len(self.blocks)

    def for_weight(self, name: str, w: torch.Tensor) -> torch.Tensor | None:
        """The blocks of weight ``name`` (``a.weight+b.weight``: the members' rows stacked), or None
        when a member has none or ``w`` is not the weight they were computed from."""
        parts = [self.blocks.get(p) for p in name.split("+")]
        if any(p is None for p in parts):
            return None
        blocks = parts[0][0] if len(parts) == 1 else torch.cat([p[0] for p in parts])
        expect = np.concatenate([p[1] for p in parts])
        if tuple(blocks.shape) != (w.shape[0], Q4_0.row_bytes(w.shape[1])):
            return None
        got = fingerprint(w)
        if got.shape != expect.shape or not np.allclose(got, expect, rtol=1e-9, atol=1e-30):
            return None
        return blocks


def gptq_q4_0(weight, hessian, damp: float = DAMP) -> tuple[np.ndarray, np.ndarray]:
    """``(rounded [out, in] float32 on the Q4_0 grid, scales [out, in / 32] float32)`` for
    ``weight`` (tensor or array) by GPTQ with ``hessian`` [in, in] (``E[x x^T]`` of the linear's
    inputs). Several linears that read one input (q/k/v, gate/up) can go as one weight, their rows
    stacked: the rows are independent given H.

    Numpy, the weight held transposed (``[in, out]``: the column being rounded is one contiguous
    row), one Q4_0 block of 32 columns per lazy batch: the sweep's per-column work is ~10 vector
    ops, a few seconds for a 135M model."""
    from .ggml import _q4_0

    w = np.array(weight.detach().to(torch.float32).numpy() if isinstance(weight, torch.Tensor) else weight,
                 dtype=np.float32).T.copy()  # [in, out]
    n, out = w.shape
    h = np.array(hessian.detach().to(torch.float64).numpy() if isinstance(hessian, torch.Tensor) else hessian,
                 dtype=np.float64)
    diag = np.diagonal(h).copy()
    dead = diag <= 0
    h[dead, dead] = 1.0
    w[dead] = 0.0  # an input column that never carries signal: its weights cannot matter
    mean = float(np.diagonal(h).mean())
    th = torch.from_numpy(h)
    for extra in (damp, 0.1, 1.0):  # more damping if H is not positive definite
        # torch's factorizations: numpy's took 0.6 s for a 576 x 576 Cholesky on a busy 2-core machine
        hd = th + torch.eye(n, dtype=th.dtype) * (extra * mean)
        lower, info = torch.linalg.cholesky_ex(hd)
        if int(info) == 0:
            upper, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(lower), upper=True)  # of H^-1
            if int(info) == 0:
                break
    else:
        raise ValueError("GPTQ: the calibration Hessian is not positive definite even damped")
    hinv = upper.to(torch.float32).numpy()
    tw = torch.from_numpy(w)  # the block updates as torch matmuls on the same memory
    imp = np.maximum(diag, mean * 1e-6 + 1e-30).astype(np.float32)
    q = np.empty_like(w)
    scales = np.empty((n // BLOCK, out), np.float32)
    err = np.empty((BLOCK, out), np.float32)
    for b0 in range(0, n, BLOCK):  # one Q4_0 block of columns per lazy batch
        b1 = b0 + BLOCK
        wb = w[b0:b1]  # a view: updated in place
        rec, _, _ = _q4_0(np.ascontiguousarray(wb.T), True, np.ascontiguousarray(np.broadcast_to(imp[b0:b1], (out, BLOCK))))
        d = rec["d"].astype(np.float32)
        scales[b0 // BLOCK] = d
        nz = d != 0
        inv = np.where(nz, 1 / np.where(nz, d, 1), 0).astype(np.float32)
        hb = hinv[b0:b1, b0:b1]
        for i in range(BLOCK):
            col = wb[i]
            c = col * inv
            c += np.float32(8.5)
            np.trunc(c, out=c)
            np.clip(c, 0, 15, out=c)
            c -= 8
            c *= d
            q[b0 + i] = c
            e = np.subtract(col, c, out=err[i])
            e /= hb[i, i]
            if i + 1 < BLOCK:
                wb[i + 1:] -= hb[i, i + 1:, None] * e[None, :]
        if b1 < n:
            tw[b1:].sub_(torch.from_numpy(np.ascontiguousarray(hinv[b0:b1, b1:].T)) @ torch.from_numpy(err))
    return q.T.copy(), scales.T.copy()


def _layer(name: str) -> int:
    m = re.search(r"\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def gptq_q4_0_rounding(model: nn.Module, run, skip=(), importance=None) -> Rounding:
    """GPTQ Q4_0 blocks for every ``nn.Linear`` of ``model`` whose input dim is a multiple of 32
    (not the modules in ``skip``: the lm_head, kept at Q8_0 or given to the plain search).
    ``run()`` runs the model on the calibration samples (called once per chunk of layers).

    The Hessians are measured on the *quantized* model: while ``run()`` goes, every linear holds
    its importance-weighted Q4_0 rounding (``importance``: an :class:`~.importance.Importance`, or
    None for the plain search; the float weights are put back afterwards, whatever happens), so
    each linear is rounded against the inputs the quantized model will feed it (GPTQ's sequential
    rule, measured in one pass instead of one per layer). Measured on SmolLM2-135M, eager (every
    linear Q4_0, tied table Q8_0; perplexity of 512 tokens of pydoc "execmodel" / CPython's
    LICENSE): with the built-in corpus, float-model Hessians +5.2 % / +22.6 %, quantized-model
    Hessians +4.7 % / +18.5 %, the weighted search alone +3.5 % / +11.8 %; on random ids +27.8 %.
    A few thousand tokens are too few for GPTQ here (it fits them): opt-in, not the default
    (benchmarks/README.md "The q4_0 default on the built-in corpus").
    """
    from .ggml import pack

    t0 = time.perf_counter()
    aliases: dict[int, list[str]] = {}
    for pname, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(pname)
    skip_ids = {id(m) for m in skip}
    linears = [(n, m) for n, m in model.named_modules()
               if isinstance(m, nn.Linear) and id(m) not in skip_ids and m.in_features % BLOCK == 0
               and m.weight.dim() == 2]
    # chunks of consecutive layers whose Hessians (d^2 float32 per distinct input, counted per linear:
    # an upper bound) fit the budget
    chunks, cur, size = [], [], 0
    for n, m in linears:
        b = m.in_features ** 2 * 4
        if cur and size + b > HESSIAN_BUDGET and _layer(n) != _layer(cur[-1][0]):
            chunks.append(cur)
            cur, size = [], 0
        cur.append((n, m))
        size += b
    if cur:
        chunks.append(cur)
    rounding = Rounding()
    floats = {id(m): m.weight.data for _, m in linears}
    try:
        with torch.no_grad():
            for n, m in linears:  # the stand-in: the weighted search's rounding, dequantized
                imp = None if importance is None else importance.for_weight(n + ".weight", m.in_features)
                blocks, _, _ = pack(m.weight.data, Q4_0, importance=imp)
                m.weight.data = torch.from_numpy(_dequantize(blocks, tuple(m.weight.shape))).to(m.weight.dtype)
        _rounding(model, chunks, run, aliases, rounding, floats)
    finally:
        for _, m in linears:
            m.weight.data = floats[id(m)]
    rounding.seconds = time.perf_counter() - t0
    return rounding


def _dequantize(blocks: torch.Tensor, shape) -> np.ndarray:
    rec = blocks.numpy().reshape(shape[0], -1).view(Q4_0.record()).reshape(shape[0], -1)
    q = rec["q"]
    codes = np.concatenate([q & 15, q >> 4], -1).astype(np.float32) - 8
    return (codes * rec["d"].astype(np.float32)[..., None]).reshape(shape)


def _rounding(model, chunks, run, aliases, rounding, floats) -> None:
    """Each chunk: hooks sum ``x x^T`` per input group while ``run()`` goes, then GPTQ rounds the
    float weights (``floats``) of the group's linears, rows stacked."""
    from .ggml import pack

    for chunk in chunks:
        sums: dict[int, list] = {}   # input group -> [H, rows, the group's latest input tensor]
        key: dict[str, int] = {}     # linear name -> its input's group
        hooks = []

        def hook(mod, args, name):
            x = args[0] if args else None
            if not isinstance(x, torch.Tensor) or not x.is_floating_point():
                return
            g = key.get(name)
            if g is None:  # the same tensor object as an earlier linear's: share its Hessian
                g = key[name] = next((k for k, v in sums.items() if v[2] is x), len(sums))
                sums.setdefault(g, [torch.zeros(x.shape[-1], x.shape[-1]), 0, x])
            acc = sums[g]
            flat = x.detach().reshape(-1, x.shape[-1]).to(torch.float32)
            acc[0].addmm_(flat.T, flat)
            acc[1] += flat.shape[0]
            acc[2] = x

        for n, m in chunk:
            hooks.append(m.register_forward_pre_hook(lambda mod, a, n=n: hook(mod, a, n)))
        try:
            with torch.no_grad():
                run()
        finally:
            for h in hooks:
                h.remove()
        for acc in sums.values():
            acc[2] = None
        groups: dict[int, list] = {}
        for n, m in chunk:
            g = key.get(n)
            if g is not None and sums[g][1]:
                groups.setdefault(g, []).append((n, m))
        for g, members in groups.items():
            hmean = (sums[g][0] / sums[g][1]).numpy()
            with torch.no_grad():
                stacked = np.concatenate([floats[id(m)].to(torch.float32).numpy() for _, m in members])
                qw, scales = gptq_q4_0(stacked, hmean)
                r0 = 0
                for n, m in members:
                    rows = m.weight.shape[0]
                    blocks, _, _ = pack(torch.from_numpy(qw[r0:r0 + rows]), Q4_0, scales=scales[r0:r0 + rows])
                    r0 += rows
                    fp = fingerprint(floats[id(m)])
                    for pname in aliases.get(id(m.weight), [n + ".weight"]):
                        rounding.blocks[pname] = (blocks, fp)
        del sums
