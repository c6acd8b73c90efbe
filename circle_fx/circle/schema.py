"""Facts about the Circle schema, in one place for the writer, reader, verify and inspect.

circle_schema's generated Python is a module per table with irregular names (``RoPEOptions``,
``SelectV2Options``, ``ReducerOptions`` shared by MEAN/SUM/...), operator codes that are
negative for Circle-only ops (RMS_NORM = -6), and two option unions (``BuiltinOptions`` and
``BuiltinOptions2``). Everything that maps between those and what circle_fx means lives
here, so the side that writes a file and the sides that read it can never disagree.

No torch here: this package describes the artifact and must import without a model stack.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from circle_schema import circle

BO = circle.BuiltinOperator.BuiltinOperator
BOPT = circle.BuiltinOptions.BuiltinOptions
BOPT2 = circle.BuiltinOptions2.BuiltinOptions2
TT = circle.TensorType.TensorType

# first name wins where two share a code (none do in schema 0.10, but stay deterministic)
_OP_NAMES: dict[int, str] = {}
for _k, _v in vars(BO).items():
    if not _k.startswith("_"):
        _OP_NAMES.setdefault(_v, _k)
_TYPE_NAMES = {v: k for k, v in vars(TT).items() if not k.startswith("_")}


def op_name(code: int) -> str:
    """``BO.RMS_NORM`` -> ``"RMS_NORM"``; an unknown code as its number."""
    return _OP_NAMES.get(code, str(code))


def type_name(tensor_type: int) -> str:
    """``TT.FLOAT32`` -> ``"FLOAT32"``."""
    return _TYPE_NAMES.get(tensor_type, str(tensor_type))


# ------------------------------------------------------------------------------ dtypes

NUMPY_TO_CIRCLE = {np.dtype(np.float32): TT.FLOAT32, np.dtype(np.float16): TT.FLOAT16,
                   np.dtype(np.int64): TT.INT64, np.dtype(np.int32): TT.INT32, np.dtype(np.int16): TT.INT16,
                   np.dtype(np.int8): TT.INT8, np.dtype(np.uint8): TT.UINT8, np.dtype(np.bool_): TT.BOOL}
CIRCLE_TO_NUMPY = {v: k for k, v in NUMPY_TO_CIRCLE.items()}


# ------------------------------------------------------------------------------ options

#: ops whose options table does not follow the ``ADD -> AddOptions`` naming rule (the rule
#: itself is matched case-insensitively, so ``ROPE -> RoPEOptions`` and ``BATCH_MATMUL ->
#: BatchMatMulOptions`` need no entry)
OPTION_ALIASES = {"MEAN": "ReducerOptions", "SUM": "ReducerOptions", "REDUCE_MAX": "ReducerOptions",
                  "REDUCE_MIN": "ReducerOptions", "REDUCE_PROD": "ReducerOptions", "REDUCE_ANY": "ReducerOptions",
                  "MAXIMUM": "MaximumMinimumOptions", "MINIMUM": "MaximumMinimumOptions"}
#: ops that onert runs (or requires) without an options table although the schema has one
NO_OPTIONS = {"RESHAPE", "CAST"}
#: lower-cased class name -> the schema's spelling (``ropeoptions`` -> ``RoPEOptions``)
_OPTION_CLASSES = {m.lower(): m for m in dir(circle) if m.endswith("Options")}
_BY_CODE: dict[int, str | None] = {}


def options_class_name(code: int) -> str | None:
    """The options table an operator carries (``"RoPEOptions"`` for ROPE), or None."""
    if code not in _BY_CODE:
        name = op_name(code)
        guess = OPTION_ALIASES.get(name) or "".join(p.capitalize() for p in name.split("_")) + "Options"
        _BY_CODE[code] = None if name in NO_OPTIONS else _OPTION_CLASSES.get(guess.lower())
    return _BY_CODE[code]


def options_union(class_name: str) -> tuple[int, int]:
    """``(1, BuiltinOptions value)`` or ``(2, BuiltinOptions2 value)`` for an options class."""
    if hasattr(BOPT, class_name):
        return 1, getattr(BOPT, class_name)
    if hasattr(BOPT2, class_name):
        return 2, getattr(BOPT2, class_name)
    raise KeyError(f"{class_name} is in neither BuiltinOptions union")


def make_options(class_name: str, **fields):
    """``make_options("AddOptions", fusedActivationFunction=0)`` -> a populated ``AddOptionsT``.

    A misspelled field would be silently added as a new Python attribute and never
    written (onert would then run with the default), so unknown fields raise.
    """
    obj = getattr(getattr(circle, class_name), class_name + "T")()
    for k, v in fields.items():
        if not hasattr(obj, k):
            raise AttributeError(f"{class_name} has no field {k}")
        setattr(obj, k, v)
    return obj


def default_options(code: int):
    """An options table with default values for ``code``, or None if the op has none.

    onert crashes on operators whose options table is missing (an ADD without
    ``AddOptions`` segfaults), so every op that has a table gets one.
    """
    name = options_class_name(code)
    return make_options(name) if name is not None else None


# -------------------------------------------------------------------------- quantization

@dataclass(frozen=True)
class QuantParams:
    """Affine quantization of a tensor: ``real = scale * (q - zero_point)``.

    One scale/zero point per tensor, or one per slice along ``axis`` (Circle's
    ``quantizedDimension``). Carried from FX ``node.meta[QUANT_META]`` through the
    builder to the flatbuffer, and read back by the reader.
    """

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int = 0

    def __post_init__(self):
        # Circle stores scales as float32: keep exactly what the file will hold
        object.__setattr__(self, "scale", tuple(float(s) for s in np.atleast_1d(self.scale).astype(np.float32)))
        object.__setattr__(self, "zero_point", tuple(int(z) for z in np.atleast_1d(self.zero_point)))
        if len(self.scale) != len(self.zero_point):
            raise ValueError(f"{len(self.scale)} scales but {len(self.zero_point)} zero points")

    @property
    def per_channel(self) -> bool:
        return len(self.scale) > 1

    def describe(self) -> str:
        if not self.per_channel:
            return f"scale={self.scale[0]:.6g} zp={self.zero_point[0]}"
        zps = set(self.zero_point)
        zp = f"zp={zps.pop()}" if len(zps) == 1 else f"zp {min(self.zero_point)}..{max(self.zero_point)}"
        return (f"per-channel axis={self.axis} ({len(self.scale)} scales "
                f"{min(self.scale):.3g}..{max(self.scale):.3g}, {zp})")
