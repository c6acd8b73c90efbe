"""``circle-fx inspect``: a Circle file's operators, tensors and buffers as plain tables.

Works from :func:`circle_fx.circle.reader.read_circle`, so it shows what is actually in the file
(any Circle file, not only ones circle_fx wrote). Operator options are decoded generically
from the schema and only values that differ from the schema defaults are printed, which
keeps rows short while still showing what matters (``epsilon``, ``adjointRhs``...).
"""
from __future__ import annotations

from collections import Counter

import numpy as np
from circle_schema import circle

from . import int4
from .reader import CircleFile, OperatorView, read_circle
from .schema import BOPT, BOPT2

SECTIONS = ("operators", "tensors", "buffers")

_OPTION_NAMES = {v: k for k, v in vars(BOPT).items() if not k.startswith("_")}
_OPTION2_NAMES = {v: k for k, v in vars(BOPT2).items() if not k.startswith("_")}


def _table(headers: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> list[str]:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]

    def fmt(cells):
        out = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(out).rstrip()

    return [fmt(headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]


def _value(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, np.ndarray)):
        return "[" + ",".join(_value(x) for x in list(v)) + "]"
    return str(v)


def operator_options(op: OperatorView) -> str:
    """``name=value`` for each option that differs from its schema default ('' if none)."""
    if op.options_type:
        name = _OPTION_NAMES.get(op.options_type)
        table = op.raw.BuiltinOptions() if op.raw is not None else None
    else:
        name = _OPTION2_NAMES.get(op.options2_type) if op.options2_type else None
        table = op.raw.BuiltinOptions2() if op.raw is not None and name else None
    module = getattr(circle, name, None) if name else None
    if table is None or module is None:
        return ""
    try:
        reader = getattr(module, name)()
        reader.Init(table.Bytes, table.Pos)
        obj_type = getattr(module, name + "T")
        values, defaults = vars(obj_type.InitFromObj(reader)), vars(obj_type())
    except Exception:  # an options table this schema version cannot decode
        return "?"
    return " ".join(f"{k}={_value(v)}" for k, v in values.items() if _value(v) != _value(defaults.get(k)))


def _shape(t) -> str:
    dims = t.shape_signature if t.shape_signature is not None else t.shape
    return "[" + ",".join(str(d) for d in dims) + "]"


def format_circle(cf: CircleFile, sections=SECTIONS, title: str = "") -> str:
    """Render ``cf`` as text: a header, then one table per requested section."""
    tensors = cf.tensors

    def tname(i: int) -> str:
        return "-" if i < 0 else tensors[i].name if i < len(tensors) else f"<bad tensor {i}>"

    hist = Counter(op.name for op in cf.operators)
    const_bytes = sum(b.size for b in cf.buffers)
    lines = []
    if title:
        lines.append(title)
    lines.append(f"file bytes: {cf.file_size:,}   version: {cf.version}   subgraphs: {cf.num_subgraphs}"
                 + (f"   description: {cf.description}" if cf.description else ""))
    lines.append(f"operators: {len(cf.operators)}   tensors: {len(tensors)}   "
                 f"buffers: {sum(1 for b in cf.buffers if b.size)} non-empty of {len(cf.buffers)}   "
                 f"constant bytes: {const_bytes:,}")
    lines.append("inputs : " + ", ".join(f"{tname(i)}{_shape(tensors[i])}" for i in cf.inputs))
    lines.append("outputs: " + ", ".join(f"{tname(i)}{_shape(tensors[i])}" for i in cf.outputs))
    lines.append("op histogram: " + ", ".join(f"{k} {v}" for k, v in hist.most_common()))
    four = [t for t in tensors if int4.is_int4(t.type)]
    if four:  # packed two per byte (circle/int4.py): their byte counts are half their element counts
        packed = {t.buffer for t in four if 0 <= t.buffer < len(cf.buffers)}
        lines.append(f"4-bit weights: {len(four)} tensors ({', '.join(sorted({t.type_name for t in four}))}, "
                     f"two elements per byte, low nibble first), {sum(cf.buffers[b].size for b in packed):,} bytes")
    limits = cf.limits
    if limits:  # what a host must keep its inputs within (circle_fx/emit/index_limits.py)
        parts = []
        for name, entry in sorted((limits.get("inputs") or {}).items()):
            if "index_range" in entry:
                parts.append(f"{name} values in {entry['index_range'][0]}..{entry['index_range'][1]}")
            parts += [f"{name} dim {d} <= {m}" for d, m in sorted((entry.get("max_dims") or {}).items())]
        parts += [f"{k} {v}" for k, v in sorted(limits.items()) if k not in ("inputs", "version")]
        lines.append("limits: " + ("; ".join(parts) or "none"))

    if "operators" in sections:
        rows = [[str(op.index), op.name, ", ".join(tname(i) for i in op.inputs),
                 ", ".join(tname(i) for i in op.outputs), operator_options(op)] for op in cf.operators]
        lines += ["", f"Operators ({len(rows)})"] + _table(["#", "op", "inputs", "outputs", "options"], rows, {0})

    if "tensors" in sections:
        rows = []
        for t in tensors:
            b = cf.buffers[t.buffer] if 0 <= t.buffer < len(cf.buffers) else None
            role = ("input" if t.index in cf.inputs else "output" if t.index in cf.outputs
                    else "const" if b is not None and b.size else "")
            rows.append([str(t.index), t.name, t.type_name, _shape(t), str(t.buffer),
                         f"{b.size:,}" if b is not None and b.size else "", role,
                         t.quantization.describe() if t.quantization is not None else ""])
        lines += ["", f"Tensors ({len(rows)})"] + _table(
            ["#", "name", "type", "shape", "buffer", "bytes", "role", "quantization"], rows, {0, 4, 5})

    if "buffers" in sections:
        users: dict[int, list[str]] = {}
        for t in tensors:
            users.setdefault(t.buffer, []).append(t.name)
        rows = [[str(b.index), f"{b.size:,}", f"external @{b.offset}" if b.offset else "inline",
                 ", ".join(users.get(b.index, [])) or "(unused)"]
                for b in cf.buffers if b.size]
        empty = len(cf.buffers) - len(rows)
        lines += ["", f"Buffers ({len(rows)} with data, {empty} empty not shown)"] + _table(
            ["#", "bytes", "where", "tensors"], rows, {0, 1})
    return "\n".join(lines)


def inspect_file(path, sections=SECTIONS) -> str:
    """Read ``path`` and format it; raises :class:`~circle_fx.errors.VerifyError` if unreadable."""
    return format_circle(read_circle(path), sections, title=str(path))
