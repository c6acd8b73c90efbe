"""dtype mapping between torch, numpy and Circle's ``TensorType``."""
from __future__ import annotations

import numpy as np
import torch

from ..circle.schema import CIRCLE_TO_NUMPY, NUMPY_TO_CIRCLE, TT  # noqa: F401  (re-exported)
from ..errors import UnsupportedDtypeError
from ..lazy import materialize

TORCH_TO_CIRCLE = {
    torch.float32: TT.FLOAT32,
    torch.float16: TT.FLOAT16,
    torch.int64: TT.INT64,
    torch.int32: TT.INT32,
    torch.int16: TT.INT16,
    torch.int8: TT.INT8,
    torch.uint8: TT.UINT8,
    torch.bool: TT.BOOL,
}
TORCH_TO_NUMPY = {
    torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64,
    torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
    torch.uint8: np.uint8, torch.bool: np.bool_,
}


def circle_type(dtype, where: str = "") -> int:
    if isinstance(dtype, torch.dtype):
        if dtype in TORCH_TO_CIRCLE:
            return TORCH_TO_CIRCLE[dtype]
    else:
        dt = np.dtype(dtype)
        if dt in NUMPY_TO_CIRCLE:
            return NUMPY_TO_CIRCLE[dt]
    hint = " (cast the model to float32 first, e.g. model.float())" if dtype in (torch.bfloat16, torch.float64) else ""
    raise UnsupportedDtypeError(f"dtype {dtype} has no Circle tensor type{hint}" + (f": {where}" if where else ""))


def numpy_dtype(dtype: torch.dtype, where: str = ""):
    circle_type(dtype, where)
    return TORCH_TO_NUMPY[dtype]


def to_numpy(t: torch.Tensor, where: str = "") -> np.ndarray:
    """A numpy view of a CPU tensor (no copy when it is contiguous); a lazy constant's values."""
    circle_type(t.dtype, where)
    t = materialize(t).detach()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.numpy()
