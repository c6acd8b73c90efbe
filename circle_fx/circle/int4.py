"""4-bit integer tensors (Circle / TFLite ``INT4`` = 17, ``UINT4`` = -1): the byte layout.

The layout is TFLite's (``tflite::PackInt4ValuesDensely`` / ``UnpackDenseInt4IntoInt8``): the
tensor's elements in row-major order, two per byte, element ``2i`` in the **low** nibble of byte
``i`` and element ``2i + 1`` in its high nibble; an odd count leaves the last high nibble zero.
So a ``[out, in]`` weight takes ``ceil(out * in / 2)`` bytes and its Circle shape stays
``[out, in]``. ``INT4`` nibbles are two's complement (-8..7), ``UINT4`` plain (0..15). The
quantization parameters are the ordinary ones (per tensor, or one scale per slice along
``quantized_dimension``), so any reader of Circle/TFLite quantization shows them.

This module only describes and converts the layout (numpy, no torch): ``verify`` checks buffer
sizes with :func:`nbytes`, the reader unpacks with :func:`unpack`, the emitter packs with
:func:`pack`.
"""
from __future__ import annotations

import math

import numpy as np

from .schema import TT

#: Circle tensor type -> (smallest, largest) value of its elements
RANGE = {TT.INT4: (-8, 7), TT.UINT4: (0, 15)}


def is_int4(tensor_type: int) -> bool:
    """Is ``tensor_type`` a 4-bit element type (two elements per byte)?"""
    return tensor_type in RANGE


def nbytes(shape) -> int:
    """Bytes of a 4-bit tensor of ``shape``: two elements per byte, the count rounded up."""
    return (math.prod(list(shape)) + 1) // 2


def pack(values, tensor_type: int = TT.INT4) -> np.ndarray:
    """The bytes of ``values`` (integers inside the type's range, any shape) as a 1-D uint8
    array in the dense layout (module docstring). Out-of-range values raise ``ValueError``:
    a nibble would silently wrap."""
    lo, hi = RANGE[tensor_type]
    v = np.asarray(values).reshape(-1).astype(np.int16)
    if v.size and (v.min() < lo or v.max() > hi):
        raise ValueError(f"4-bit values must lie in [{lo}, {hi}], got {int(v.min())}..{int(v.max())}")
    nib = (v & 0x0F).astype(np.uint8)
    if nib.size % 2:
        nib = np.concatenate([nib, np.zeros(1, np.uint8)])
    return nib[0::2] | (nib[1::2] << 4)


def unpack(data, shape, tensor_type: int = TT.INT4) -> np.ndarray:
    """The elements of a 4-bit tensor of ``shape`` from its bytes ``data``: int8 for ``INT4``
    (sign-extended), uint8 for ``UINT4``."""
    raw = np.frombuffer(data, np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) \
        else np.asarray(data, np.uint8).reshape(-1)
    n = math.prod(list(shape))
    out = np.empty(2 * raw.size, np.uint8)
    out[0::2], out[1::2] = raw & 0x0F, raw >> 4
    out = out[:n]
    if tensor_type == TT.INT4:
        out = ((out.astype(np.int8) << 4) >> 4).astype(np.int8)  # sign-extend the nibble
    return out.reshape(list(shape))
