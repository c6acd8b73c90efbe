"""Packing float weights into GGML Q8_0 / Q4_0 blocks (layout: :mod:`circle_fx.circle.ggml`).

The bytes are written by circle_fx (no ggml dependency), block by block along the input dim:

- Q8_0: ``d = max|x| / 127`` (float16), ``q = round(x / d)``: ggml's own rule, bit for bit (the
  tests compare with the ``gguf`` package's reference); with 255 levels nothing is gained by searching.
- Q4_0: 16 levels ``(q - 8) * d``, q in 0..15, so the scale matters. ggml's rule is
  ``d = m / -8`` with ``m`` the element of largest magnitude (it lands exactly on -8, the other
  side gets only +7 levels). We try a small set of candidate scales per block (``m / -8`` and
  ``m / 7`` scaled by factors in [0.75, 1.0]: shrinking clips the extreme element but refines the
  other 31), plus the least-squares refit of the best one's codes, and keep the one with the
  smallest squared error of the block (with ``d`` rounded to float16 as stored). The gain over
  ``m / -8`` is returned so ``summary()`` can report it.
- Q4_0 with an importance per input column (``QuantConfig(importance=...)``, mean ``x^2`` of the
  linear's input: :mod:`circle_fx.quant.importance`): the same search over a finer set of
  candidates, minimising the *weighted* squared error ``sum imp_j (w_j - q_j d)^2`` and with the
  weighted least-squares refit: the error of what matters for ``W x`` rather than of ``W``.

Work goes through the rows in chunks (~1 MiB of weights, ~16 candidate temporaries), so a large
weight never needs a full-size float temporary.
"""
from __future__ import annotations

import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import numpy as np
import torch

from ..circle.ggml import BLOCK, Q4_0, Q8_0, BlockType
from ..program import row_chunks

_CHUNK_ELEMS = 1 << 18
#: Q4_0 candidate scales: ``m / base * factor`` (m = the block's largest-magnitude element)
_Q4_BASES = (-8.0, 7.0)
_Q4_FACTORS = np.array([1.0, 0.95, 0.9, 0.85, 0.8], np.float32)
#: the candidates with an importance: 6 factors in [0.8, 1.05]. Measured on SmolLM2-135M (every linear
#: Q4_0, lm_head Q8_0, importance from 4 pydoc topics, 512 tokens of "execmodel", eager): +1.9 %
#: perplexity, against +5.8 % with the 21 factors in [0.7, 1.1] used before (which also cost 2.4x the
#: packing time): the finer, wider search fits each block's weighted error better and the model worse
_Q4_FACTORS_WEIGHTED = np.linspace(0.8, 1.05, 6).astype(np.float32)


def _f16(d: np.ndarray) -> np.ndarray:
    """The scale as stored (float16), back in float32; never 0 (a zero block keeps d = 0 bytes)."""
    return d.astype(np.float16).astype(np.float32)


def _q8_0(b: np.ndarray) -> tuple[np.ndarray, float, float]:
    """ggml's ``quantize_row_q8_0_ref`` bit for bit: the codes use the float32 scale, roundf."""
    d = np.abs(b).max(-1) / np.float32(127)
    x = b * _inverse(d)[:, None]
    q = (np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))).astype(np.int8)
    rec = np.empty(b.shape[:-1], Q8_0.record())
    rec["d"] = d
    rec["q"] = q
    return rec, 0.0, 0.0


class _Scratch:
    """The search's temporaries for one chunk of blocks, allocated once per thread and reused.

    Allocating them afresh cost more than the arithmetic (each 1 MiB temporary is a new mapping
    whose pages fault in). The blocks are held transposed, ``[32, n]`` (element j of every block in
    one row): every op is then a long contiguous loop, and the per-block sum of 32 errors is 6 adds
    of whole rows instead of numpy's reduce over a length-32 axis (which runs its inner loop once per
    block). The adds are numpy's own pairwise order for 32 float32 (8 accumulators over strides of
    8, then a tree), so every error, hence every choice and byte, is identical to ``.sum(-1)``."""

    def __init__(self, n: int):
        self.n = n
        self.x = np.empty((BLOCK, n), np.float32)   # a candidate's codes
        self.r = np.empty((BLOCK, n), np.float32)   # its residual
        self.acc = np.empty((8, n), np.float32)
        self.e = np.empty(n, np.float32)
        self.inv = np.empty(n, np.float32)

    def view(self, n: int) -> "_Scratch":
        v = object.__new__(_Scratch)
        v.n, v.x, v.r, v.acc, v.e, v.inv = n, self.x[:, :n], self.r[:, :n], self.acc[:, :n], self.e[:n], self.inv[:n]
        return v


_local = threading.local()


def _scratch(n: int) -> _Scratch:
    s = getattr(_local, "scratch", None)
    if s is None or s.n < n:
        s = _local.scratch = _Scratch(n)
    return s.view(n)


def _inverse(d: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    nz = d != 0
    if out is None:
        out = np.empty(d.shape, np.float32)
    np.divide(1, np.where(nz, d, 1), out=out)
    out[~nz] = 0
    return out


def _block_sum(r: np.ndarray, s: _Scratch, out: np.ndarray) -> np.ndarray:
    """``r.T.sum(-1)`` for ``r`` [32, n], bit for bit: numpy's pairwise sum of 32 float32 keeps 8
    accumulators ``a_j = ((x_j + x_j+8) + x_j+16) + x_j+24``, then adds them as a tree."""
    v = r.reshape(4, 8, -1)
    a = np.add(v[0], v[1], out=s.acc)
    np.add(a, v[2], out=a)
    np.add(a, v[3], out=a)
    t = np.add(a[0::2], a[1::2], out=v[0, :4])   # r's rows are free now: reuse them
    u = np.add(t[0::2], t[1::2], out=v[1, :2])
    return np.add(u[0], u[1], out=out)


def _codes(bt, d, s: _Scratch, out=None):
    """Q4_0 codes 0..15 (as float32) of transposed blocks ``bt`` [32, n] for scales ``d`` [n]:
    ggml's ``(int8)(x / d + 8.5)`` clamped to 15 (truncation; ``x / d + 8.5 >= 0`` except when
    clipped)."""
    x = s.x if out is None else out
    np.multiply(bt, _inverse(d, s.inv), out=x)
    np.add(x, np.float32(8.5), out=x)
    np.trunc(x, out=x)
    return np.clip(x, 0, 15, out=x)


def _sq_err(bt, d, q, imp, s: _Scratch, out=None):
    """``sum (imp) (b - (q - 8) d)^2`` per block, written into ``out`` (or ``s.e``)."""
    r = s.r
    np.subtract(q, 8, out=r)
    np.multiply(r, d, out=r)
    np.subtract(bt, r, out=r)
    np.multiply(r, r, out=r)
    if imp is not None:
        np.multiply(r, imp, out=r)
    return _block_sum(r, s, s.e if out is None else out)


def _q4_0(b: np.ndarray, search: bool = True, imp: np.ndarray | None = None) -> tuple[np.ndarray, float, float]:
    """``(blocks, squared error with ggml's m/-8, squared error chosen)`` for blocks ``b`` [n, 32]
    (both weighted by ``imp`` [n, 32] when given). Only the best scale per block is carried
    through the candidates; the codes are recomputed once at the end (carrying them cost 2x
    the time)."""
    n = len(b)
    s = _scratch(n)
    idx = np.abs(b).argmax(-1)
    m = np.take_along_axis(b, idx[:, None], -1)[:, 0]
    bt = np.ascontiguousarray(b.T)
    if imp is not None:
        imp = np.ascontiguousarray(imp.T)
    plain_d = _f16(m / np.float32(-8))
    # ggml's quantize_row_q4_0_ref: the codes from the float32 d
    plain_q = _codes(bt, m / np.float32(-8), s, out=np.empty((BLOCK, n), np.float32))
    plain_e = _sq_err(bt, plain_d, plain_q, imp, s, out=np.empty(n, np.float32))
    plain = float(plain_e.sum())
    if not search:
        q = plain_q
        best_d, best_e = plain_d, plain_e
    else:
        best_d, best_e = plain_d.copy(), plain_e.copy()
        better = np.empty(n, bool)
        for base in _Q4_BASES:
            for f in (_Q4_FACTORS if imp is None else _Q4_FACTORS_WEIGHTED):
                d = _f16(m / base * f)
                e = _sq_err(bt, d, _codes(bt, d, s), imp, s)
                np.less(e, best_e, out=better)
                np.copyto(best_d, d, where=better)
                np.copyto(best_e, e, where=better)
        # (weighted) least-squares scale for the chosen codes, then re-code with it
        for _ in range(1 if imp is None else 2):
            c = np.subtract(_codes(bt, best_d, s), 8, out=s.x)
            wc = c if imp is None else np.multiply(c, imp, out=s.r)
            num = _block_sum(np.multiply(bt, wc, out=np.empty_like(bt)), s, np.empty(n, np.float32))
            den = _block_sum(np.multiply(wc, c, out=s.x), s, np.empty(n, np.float32))
            d = _f16(np.where(den > 0, num / np.where(den > 0, den, 1), best_d))
            e = _sq_err(bt, d, _codes(bt, d, s), imp, s)
            np.less(e, best_e, out=better)
            np.copyto(best_d, d, where=better)
            np.copyto(best_e, e, where=better)
        q = _codes(bt, best_d, s)
        # the plain codes (float32 d) can beat the float16 d's re-coding: keep ggml's exact bytes there
        plain_wins = plain_e <= best_e
        np.copyto(q, plain_q, where=plain_wins)
        np.copyto(best_d, plain_d, where=plain_wins)
        np.copyto(best_e, plain_e, where=plain_wins)  # = the error of (best_d, q): the same numbers
    q = q.astype(np.uint8)
    rec = np.empty(n, Q4_0.record())
    rec["d"] = best_d
    rec["q"] = (q[:BLOCK // 2] | (q[BLOCK // 2:] << 4)).T
    return rec, plain, float(best_e.sum())


def mapped_empty(shape, dtype) -> np.ndarray:
    """An uninitialised array in its own anonymous mapping, not on the malloc heap.

    The packed weights live until the file is written, while the packing's chunk temporaries
    come and go between them: on the heap, each long-lived result pins the space around it and
    glibc cannot hand the freed temporaries back (measured: a 374M-parameter q4_0 export kept
    0.44 GB of freed heap, about twice its packed weights). A mapping is returned to the system
    exactly when the array dies."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if n < (1 << 20):
        return np.empty(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, n), dtype).reshape(shape)


def _q4_0_given(b: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Blocks ``b`` [n, 32] with their scales given (float16-representable ``d`` [n], GPTQ's:
    :mod:`circle_fx.quant.gptq_q4`): the codes of ``b`` on that grid, no search."""
    n = len(b)
    s = _scratch(n)
    q = _codes(np.ascontiguousarray(b.T), d.astype(np.float32), s).astype(np.uint8)
    rec = np.empty(n, Q4_0.record())
    rec["d"] = d
    rec["q"] = (q[:BLOCK // 2] | (q[BLOCK // 2:] << 4)).T
    return rec, 0.0, 0.0


def pack(w: torch.Tensor, kind: BlockType, search: bool = True,
         importance: np.ndarray | None = None, scales: np.ndarray | None = None) -> tuple[torch.Tensor, float, float]:
    """``(blocks, err_plain, err_chosen)``: ``w`` [rows, cols] (cols a multiple of 32) as a uint8
    tensor [rows, cols / 32 * block_bytes] in ggml's layout, and the total squared error of ggml's
    plain Q4_0 scale and of the chosen one (both 0 for Q8_0), weighted by ``importance`` [cols]
    when given (Q4_0 only: Q8_0 keeps ggml's rule). Raises ValueError on a bad shape or
    non-finite values. A merged weight (``StackedTensor``) is packed part by part into its rows
    (blocks run along the input dim, so stacking rows stacks their blocks): never concatenated.
    ``scales`` [rows, cols / 32] (Q4_0 only): every block's scale is given (``w`` already lies on
    that grid, GPTQ's rounding): its codes are packed as they are (both errors 0)."""
    if w.dim() != 2 or w.shape[1] % BLOCK:
        raise ValueError(f"GGML blocks need a 2-D weight whose last dim is a multiple of {BLOCK}, "
                         f"got shape {tuple(w.shape)}")
    rows, cols = w.shape
    if importance is not None:
        importance = np.asarray(importance, np.float32)
        if importance.shape != (cols,):
            raise ValueError(f"importance has shape {importance.shape}, expected ({cols},)")
        # a column that never carried signal keeps a little weight: no block's error is all zero
        importance = np.maximum(importance, importance.mean() * 1e-6 + 1e-30).reshape(1, -1, BLOCK)
    if scales is not None:
        scales = np.asarray(scales, np.float32)
        if kind is not Q4_0 or scales.shape != (rows, cols // BLOCK):
            raise ValueError(f"given scales need Q4_0 and shape {(rows, cols // BLOCK)}, got {kind.name} "
                             f"{scales.shape}")
    out = mapped_empty((rows, kind.row_bytes(cols)), np.uint8)

    def one(i, chunk):
        blocks = chunk.reshape(-1, BLOCK)
        if scales is not None:
            rec, p, c = _q4_0_given(blocks, scales[i:i + len(chunk)].reshape(-1))
            out[i:i + len(chunk)] = rec.view(np.uint8).reshape(len(chunk), -1)
            return p, c
        imp = None if importance is None else np.broadcast_to(
            importance, (len(chunk), cols // BLOCK, BLOCK)).reshape(-1, BLOCK)
        rec, p, c = _q8_0(blocks) if kind is Q8_0 else _q4_0(blocks, search, imp)
        out[i:i + len(chunk)] = rec.view(np.uint8).reshape(len(chunk), -1)
        return p, c

    # the chunks are read here, in order (a checkpoint's rows), and packed by a pool: numpy's ops
    # release the GIL, so both cores work; results are summed in chunk order (the same totals)
    results, waited = [], 0
    workers = _workers()
    with torch.no_grad(), ThreadPoolExecutor(workers) if workers > 1 else nullcontext() as pool:
        for i, part in row_chunks(w, max(1, _CHUNK_ELEMS // cols)):
            chunk = part.to(torch.float32).numpy()
            if not np.isfinite(chunk).all():
                raise ValueError(f"rows {i}..{i + len(chunk) - 1} have non-finite values (inf/nan)")
            results.append(pool.submit(one, i, chunk) if pool else one(i, chunk))
            while pool and len(results) - waited > 2 * workers:  # bound the chunks in flight
                results[waited].result()
                waited += 1
        totals = [r.result() if pool else r for r in results]
    plain = chosen = 0.0
    for p, c in totals:
        plain += p
        chosen += c
    return torch.from_numpy(out), plain, chosen


def _workers() -> int:
    """Threads for packing: the CPUs this process may use (``CIRCLE_FX_PACK_THREADS`` overrides)."""
    env = os.environ.get("CIRCLE_FX_PACK_THREADS")
    if env:
        return max(1, int(env))
    try:
        return max(1, min(4, len(os.sched_getaffinity(0))))
    except AttributeError:
        return max(1, min(4, os.cpu_count() or 1))
