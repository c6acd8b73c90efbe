"""Finding constant buffers with identical bytes, so each distinct constant is stored once.

Exported models repeat constants that torch holds as separate tensors: every layer folds its
own copy of the causal mask and the RoPE tables, and a tied embedding / lm_head is one
tensor read in two layouts (GATHER's ``[V, D]`` table and CONV_2D's ``[V, 1, 1, D]`` filter
have the same bytes). A Circle buffer is raw bytes that any number of tensors may point at,
each with its own shape and type, so identical bytes can always share one buffer.

Used twice: ``ModelBuilder.share_buffers`` merges them before the file is written, and
``circle_fx.verify`` reports any left in a file. Cheap enough to run on every export:
buffers are grouped by size, then by a sample of 256 evenly spaced bytes (distinct weights
differ there), and only what still collides is hashed in full and compared byte for byte.
O(buffers) plus O(bytes) of the buffers that really are (or look) identical.
"""
from __future__ import annotations

import hashlib
from collections import defaultdict
from typing import Sequence

import numpy as np

_SAMPLE = 256


def _bytes(buf) -> np.ndarray | None:
    """A flat uint8 view (no copy for contiguous arrays and memoryviews), None when empty."""
    if buf is None or not isinstance(buf, (np.ndarray, bytes, bytearray, memoryview)):
        return None  # a lazily stacked weight (merged linears) is a fresh concatenation: not compared
    arr = np.asarray(buf)
    if arr.nbytes == 0:
        return None
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


def duplicates(buffers: Sequence) -> dict[int, int]:
    """``{index: index of the first buffer with the same bytes}`` for every buffer (numpy
    array, bytes-like or None) whose bytes repeat an earlier one's; empty buffers, and objects
    that are neither (the writer's lazily stacked weights), never count."""
    views = [_bytes(b) for b in buffers]
    by_size: dict[int, list[int]] = defaultdict(list)
    for i, v in enumerate(views):
        if v is not None:
            by_size[v.size].append(i)
    out: dict[int, int] = {}
    for size, idxs in by_size.items():
        if len(idxs) < 2:
            continue
        picks = np.linspace(0, size - 1, num=min(size, _SAMPLE)).astype(np.int64)
        by_sample: dict[bytes, list[int]] = defaultdict(list)
        for i in idxs:
            by_sample[views[i][picks].tobytes()].append(i)
        for group in by_sample.values():
            if len(group) < 2:
                continue
            first_with: dict[bytes, list[int]] = defaultdict(list)
            for i in group:
                digest = hashlib.blake2b(views[i], digest_size=16).digest() if size > _SAMPLE else views[i].tobytes()
                for j in first_with[digest]:
                    if np.array_equal(views[i], views[j]):  # exact, not trusting the hash alone
                        out[i] = j
                        break
                else:
                    first_with[digest].append(i)
    return out


def duplicate_bytes(buffers: Sequence, dups: dict[int, int]) -> int:
    """Bytes the buffers in ``dups`` (from :func:`duplicates`) take beyond their first copies."""
    return sum(int(np.asarray(buffers[i]).nbytes) for i in dups)
