"""A bounds-checked walk of a Circle flatbuffer, done before anything reads it.

The generated ``circle_schema`` accessors trust every offset in the file: a corrupt offset
makes them raise ``IndexError``/``struct.error`` from deep inside flatbuffers, or (negative
offsets count from the end in ``struct.unpack_from``) silently read the wrong bytes, and onert
itself segfaults on such a file. :func:`check_flatbuffer` visits every table, vector and string
reachable from the root the way flatbuffers' C++ ``Verifier`` does (vtable and object inside
the file, every field inside its object, every vector/string inside the file, 4-byte aligned
tables) and raises :class:`~circle_fx.errors.VerifyError` naming the first bad place. After
it passes, the generated accessors only read bytes inside the file.

The schema is not written out by hand: the field layout of every table (vtable slot, kind,
element size, sub-table class) is read from the generated accessor source of
``circle_schema`` once, so the walk covers every table and option table of the schema the
reader uses, and follows it when circle_schema changes.
"""
from __future__ import annotations

import importlib
import inspect
import re
import struct
from dataclasses import dataclass
from functools import lru_cache

from circle_schema import circle

from ..errors import VerifyError

_SIZES = {"Bool": 1, "Int8": 1, "Uint8": 1, "Int16": 2, "Uint16": 2, "Int32": 4, "Uint32": 4,
          "Float32": 4, "Int64": 8, "Uint64": 8, "Float64": 8, "UOffsetT": 4}
_PKG = circle.Model.__name__.rsplit(".", 1)[0]  # circle_schema.v0_10.circle

_METHOD = re.compile(r"    # \w+\n    def (\w+)\(self(, j)?\):\n(.*?)(?=\n    # \w+\n    def |\Z)", re.S)
_SLOT = re.compile(r"self\._tab\.Offset\((\d+)\)")
_FLAGS = re.compile(r"number_types\.(\w+)Flags, (?:o|a) ")
_IMPORT = re.compile(r"import (\w+)\n")


#: struct format of each flatbuffers number type
FORMATS = {"Bool": "?", "Int8": "b", "Uint8": "B", "Int16": "h", "Uint16": "H", "Int32": "i", "Uint32": "I",
           "Float32": "f", "Int64": "q", "Uint64": "Q", "Float64": "d", "UOffsetT": "I"}
_DEFAULT = re.compile(r"\n        return (.+?)\s*$")


@dataclass(frozen=True)
class Field:
    """One field of a schema table, as the generated accessor reads it: its vtable ``slot``,
    ``kind`` (``scalar``, ``string``, ``table``, ``vector``, ``tables``, ``strings``, ``union``),
    ``arg`` (scalar/vector element size, sub-table class or union name), the struct ``fmt``
    of a scalar or vector element, and a scalar's schema ``default``."""

    slot: int
    kind: str
    arg: object
    fmt: str = ""
    default: object = None


@lru_cache(maxsize=None)
def fields(cls_name: str) -> dict[str, Field]:
    """Accessor name -> :class:`Field` for table ``cls_name``, read from circle_schema's generated
    source (so ``reader`` and this walk follow the schema, which is not written out here)."""
    module = importlib.import_module(f"{_PKG}.{cls_name}")
    out = {}
    for name, indexed, body in _METHOD.findall(inspect.getsource(module)):
        slot = _SLOT.search(body)
        if slot is None or name.endswith(("Length", "IsNone", "AsNumpy")):
            continue
        slot = int(slot.group(1))
        imp = _IMPORT.search(body)
        if "self._tab.Union(" in body:
            out[name] = Field(slot, "union", name)
        elif "self._tab.Vector(o)" in body:
            if "Indirect(x)" in body and imp:
                out[name] = Field(slot, "tables", imp.group(1))
            elif "String(a" in body:
                out[name] = Field(slot, "strings", None)
            else:
                flags = re.search(r"number_types\.(\w+)Flags, a \+", body)
                kind = flags.group(1) if flags else "Uint8"
                out[name] = Field(slot, "vector", _SIZES[kind], FORMATS[kind])
        elif "self._tab.String(o" in body:
            out[name] = Field(slot, "string", None)
        elif "Indirect(o + self._tab.Pos)" in body and imp:
            out[name] = Field(slot, "table", imp.group(1))
        else:
            flags = _FLAGS.search(body)
            if flags and flags.group(1) in _SIZES:
                # the accessor ends at its first blank line (the last one's match runs on to the
                # end of the module: its builder functions, whose last return is not the default)
                default = _DEFAULT.search(body.split("\n\n", 1)[0])
                value = default.group(1) if default else "0"
                value = {"True": True, "False": False}.get(value, value)
                if isinstance(value, str):
                    try:
                        value = float(value) if flags.group(1).startswith("Float") else int(value)
                    except ValueError:
                        value = 0
                out[name] = Field(slot, "scalar", _SIZES[flags.group(1)], FORMATS[flags.group(1)], value)
    return out


@lru_cache(maxsize=None)
def _layout(cls_name: str) -> tuple:
    """``((slot, kind, arg), ...)`` for table ``cls_name`` (see :func:`fields`), by slot."""
    return tuple(sorted({f.slot: (f.slot, f.kind, f.arg) for f in fields(cls_name).values()}.values()))


#: union fields whose accessor is not named after their union type
_UNION_TYPES = {"Details": "QuantizationDetails", "ArraySegments": "SparseIndexVector",
                "ArrayIndices": "SparseIndexVector"}


@lru_cache(maxsize=None)
def _union_members(field_name: str) -> dict[int, str]:
    """Union type value -> table class name (``BuiltinOptions`` 25 -> ``ReshapeOptions``)."""
    enum_name = _UNION_TYPES.get(field_name, field_name)
    enum = getattr(importlib.import_module(f"{_PKG}.{enum_name}"), enum_name)
    out = {}
    for name, value in vars(enum).items():
        if name.startswith("_") or not isinstance(value, int) or value == 0:
            continue
        try:
            importlib.import_module(f"{_PKG}.{name}")
        except ImportError:
            continue
        out[value] = name
    return out


class _Walk:
    def __init__(self, buf):
        self.buf = buf
        self.n = len(buf)
        self.seen: set = set()

    def fail(self, where: str, what: str):
        raise VerifyError(f"Circle flatbuffer is corrupt: {where}: {what} (file of {self.n} bytes)")

    def need(self, pos: int, size: int, where: str, what: str) -> None:
        if pos < 0 or pos + size > self.n:
            self.fail(where, f"{what} at byte {pos}..{pos + size} lies outside the file")

    def u32(self, pos: int, where: str, what: str) -> int:
        self.need(pos, 4, where, what)
        return struct.unpack_from("<I", self.buf, pos)[0]

    def target(self, pos: int, where: str, what: str) -> int:
        """Follow the uoffset stored at ``pos``."""
        return pos + self.u32(pos, where, what)

    def table(self, pos: int, cls: str, where: str) -> None:
        if (pos, cls) in self.seen:
            return
        self.seen.add((pos, cls))
        if pos % 4:
            self.fail(where, f"{cls} table at byte {pos} is not 4-byte aligned")
        self.need(pos, 4, where, f"{cls} table")
        vt = pos - struct.unpack_from("<i", self.buf, pos)[0]
        self.need(vt, 4, where, f"{cls} vtable")
        vt_size, obj_size = struct.unpack_from("<HH", self.buf, vt)
        if vt_size < 4 or vt_size % 2:
            self.fail(where, f"{cls} vtable size {vt_size}")
        self.need(vt, vt_size, where, f"{cls} vtable")
        self.need(pos, obj_size, where, f"{cls} table")
        if obj_size < 4:
            self.fail(where, f"{cls} table size {obj_size}")

        def field(slot: int) -> int:
            return struct.unpack_from("<H", self.buf, vt + slot)[0] if slot + 2 <= vt_size else 0

        for slot, kind, arg in _layout(cls):
            off = field(slot)
            if not off:
                continue
            here = f"{where}.{cls}@{slot}"
            size = arg if kind == "scalar" else 1 if kind == "union" else 4
            if off + size > obj_size:
                self.fail(here, f"field at offset {off} (+{size}) lies outside its {obj_size}-byte table")
            p = pos + off
            if kind == "scalar" or kind == "union":
                continue
            t = self.target(p, here, "offset")
            if kind == "table":
                self.table(t, arg, here)
            elif kind == "string":
                length = self.u32(t, here, "string length")
                self.need(t + 4, length + 1, here, f"string of {length} bytes")
            else:
                length = self.u32(t, here, "vector length")
                elem = arg if kind == "vector" else 4
                self.need(t + 4, length * elem, here, f"vector of {length} x {elem} bytes")
                if kind == "tables":
                    for k in range(length):
                        self.table(self.target(t + 4 + 4 * k, here, "offset"), arg, f"{here}[{k}]")
                elif kind == "strings":
                    for k in range(length):
                        s = self.target(t + 4 + 4 * k, here, "offset")
                        self.need(s + 4, self.u32(s, here, "string length") + 1, here, "string")
        for slot, kind, arg in _layout(cls):  # unions: the table type is in the preceding slot
            if kind != "union" or not field(slot):
                continue
            type_off = field(slot - 2)
            value = self.buf[pos + type_off] if type_off else 0
            member = _union_members(arg).get(value)
            here = f"{where}.{cls}.{arg}"
            t = self.target(pos + field(slot), here, "offset")
            if member is None:
                if value:  # an unknown option type: check its table header at least
                    self.need(t, 4, here, f"{arg} table of unknown type {value}")
                continue
            self.table(t, member, here)


def check_flatbuffer(buf) -> None:
    """Raise :class:`VerifyError` unless every offset reachable from the root ``Model`` of
    ``buf`` (bytes or memoryview, identifier already checked) stays inside ``buf``."""
    w = _Walk(buf)
    root = w.u32(0, "root", "root offset")
    w.table(root, "Model", "Model")
