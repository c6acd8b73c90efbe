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

import numpy as np
import torch

from ..circle.ggml import BLOCK, Q4_0, Q8_0, BlockType
from ..program import row_chunks

_CHUNK_ELEMS = 1 << 18
#: Q4_0 candidate scales: ``m / base * factor`` (m = the block's largest-magnitude element)
_Q4_BASES = (-8.0, 7.0)
_Q4_FACTORS = np.array([1.0, 0.95, 0.9, 0.85, 0.8], np.float32)
#: with an importance the search is worth more candidates (it is also run only when asked for)
_Q4_FACTORS_WEIGHTED = np.linspace(0.7, 1.1, 21).astype(np.float32)


def _f16(d: np.ndarray) -> np.ndarray:
    """The scale as stored (float16), back in float32; never 0 (a zero block keeps d = 0 bytes)."""
    return d.astype(np.float16).astype(np.float32)


def _inverse(d: np.ndarray) -> np.ndarray:
    return np.where(d != 0, 1 / np.where(d != 0, d, 1), 0).astype(np.float32)


def _q8_0(b: np.ndarray) -> tuple[np.ndarray, float, float]:
    """ggml's ``quantize_row_q8_0_ref`` bit for bit: the codes use the float32 scale, roundf."""
    d = np.abs(b).max(-1) / np.float32(127)
    x = b * _inverse(d)[:, None]
    q = (np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))).astype(np.int8)
    rec = np.empty(b.shape[:-1], Q8_0.record())
    rec["d"] = d
    rec["q"] = q
    return rec, 0.0, 0.0


def _codes(b, d):
    """Q4_0 codes 0..15 of blocks ``b`` [n, 32] for scales ``d`` [n]: ggml's
    ``(int8)(x / d + 8.5)`` clamped to 15 (truncation; ``x / d + 8.5 >= 0`` except when clipped)."""
    return np.clip(np.trunc(b * _inverse(d)[:, None] + np.float32(8.5)), 0, 15)


def _sq_err(b, d, q, imp=None):
    r = (q - 8) * d[:, None]
    np.subtract(b, r, out=r)
    np.multiply(r, r, out=r)
    if imp is not None:
        np.multiply(r, imp, out=r)
    return r.sum(-1)


def _q4_0(b: np.ndarray, search: bool = True, imp: np.ndarray | None = None) -> tuple[np.ndarray, float, float]:
    """``(blocks, squared error with ggml's m/-8, squared error chosen)`` for blocks ``b`` [n, 32]
    (both weighted by ``imp`` [n, 32] when given). Only the best scale per block is carried
    through the candidates; the codes are recomputed once at the end (carrying them cost 2x
    the time)."""
    idx = np.abs(b).argmax(-1)
    m = np.take_along_axis(b, idx[:, None], -1)[:, 0]
    plain_q = _codes(b, m / np.float32(-8))  # ggml's quantize_row_q4_0_ref: codes from the float32 d
    best_d = _f16(m / np.float32(-8))
    best_e = _sq_err(b, best_d, plain_q, imp)
    plain = float(best_e.sum())
    if not search:
        q = plain_q
    else:
        for base in _Q4_BASES:
            for f in (_Q4_FACTORS if imp is None else _Q4_FACTORS_WEIGHTED):
                d = _f16(m / base * f)
                e = _sq_err(b, d, _codes(b, d), imp)
                better = e < best_e
                np.copyto(best_d, d, where=better)
                np.copyto(best_e, e, where=better)
        # (weighted) least-squares scale for the chosen codes, then re-code with it
        for _ in range(1 if imp is None else 2):
            c = _codes(b, best_d) - 8
            wc = c if imp is None else c * imp
            den = (wc * c).sum(-1)
            d = _f16(np.where(den > 0, (b * wc).sum(-1) / np.where(den > 0, den, 1), best_d))
            e = _sq_err(b, d, _codes(b, d), imp)
            better = e < best_e
            np.copyto(best_d, d, where=better)
            np.copyto(best_e, e, where=better)
        q = _codes(b, best_d)
        # the plain codes (float32 d) can beat the float16 d's re-coding: keep ggml's exact bytes there
        plain_wins = _sq_err(b, _f16(m / np.float32(-8)), plain_q, imp) <= best_e
        q = np.where(plain_wins[:, None], plain_q, q)
        np.copyto(best_d, _f16(m / np.float32(-8)), where=plain_wins)
        best_e = _sq_err(b, best_d, q, imp)
    q = q.astype(np.uint8)
    rec = np.empty(b.shape[:-1], Q4_0.record())
    rec["d"] = best_d
    rec["q"] = q[:, :BLOCK // 2] | (q[:, BLOCK // 2:] << 4)
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


def pack(w: torch.Tensor, kind: BlockType, search: bool = True,
         importance: np.ndarray | None = None) -> tuple[torch.Tensor, float, float]:
    """``(blocks, err_plain, err_chosen)``: ``w`` [rows, cols] (cols a multiple of 32) as a uint8
    tensor [rows, cols / 32 * block_bytes] in ggml's layout, and the total squared error of ggml's
    plain Q4_0 scale and of the chosen one (both 0 for Q8_0), weighted by ``importance`` [cols]
    when given (Q4_0 only: Q8_0 keeps ggml's rule). Raises ValueError on a bad shape or
    non-finite values. A merged weight (``StackedTensor``) is packed part by part into its rows
    (blocks run along the input dim, so stacking rows stacks their blocks): never concatenated."""
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
    out = mapped_empty((rows, kind.row_bytes(cols)), np.uint8)
    plain = chosen = 0.0
    with torch.no_grad():
        for i, part in row_chunks(w, max(1, _CHUNK_ELEMS // cols)):
            chunk = part.to(torch.float32).numpy()
            if not np.isfinite(chunk).all():
                raise ValueError(f"rows {i}..{i + len(chunk) - 1} have non-finite values (inf/nan)")
            blocks = chunk.reshape(-1, BLOCK)
            imp = None if importance is None else np.broadcast_to(
                importance, (len(chunk), cols // BLOCK, BLOCK)).reshape(-1, BLOCK)
            rec, p, c = _q8_0(blocks) if kind is Q8_0 else _q4_0(blocks, search, imp)
            out[i:i + len(chunk)] = rec.view(np.uint8).reshape(len(chunk), -1)
            plain += p
            chosen += c
    return torch.from_numpy(out), plain, chosen
