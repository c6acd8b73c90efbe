"""Quantize/dequantize nodes (PT2E ``convert_pt2e`` output) -> Circle quantization.

A statically quantized graph arrives as float ops between ``quantized_decomposed``
``quantize_per_tensor`` (Q) and ``dequantize_per_*`` (DQ) nodes. Two passes bracket the
ordinary pipeline, so every fusion (RMSNorm above all) works on the quantized graph
unchanged:

- :class:`QDQPrepare` (first) makes Q/DQ regular enough for patterns: identical Q or DQ
  nodes of one value are merged (``convert_pt2e`` gives every user its own DQ, and an
  RMSNorm reads its input twice, which must be *one* node for the pattern),
  ``Q(DQ(q))`` with the same parameters becomes ``q``, and DQ nodes are tagged with their
  parameters so that constant folding, which turns ``DQ(int8 weight)`` into a float
  weight (and copies the node's meta onto the constant), leaves a record
  (``DEQUANTIZED_FROM``) of the integers it came from. For the
  ``onert`` target int8 activations become uint8 (``q + 128``, same real values): onert
  0.1.0's QUANTIZE to int8 is silently wrong, uint8 is exact.
- :class:`QDQLower` (last) first moves reshapes to the integer side of per-tensor Q/DQ
  (:func:`_views_inside`: a 1-D convolution reaches its 2-D form through a unit-height reshape),
  then turns each ``DQ -> op -> Q`` chain into one quantized op
  (:mod:`circle_fx.dialect.quantized`) where the target has an integer kernel, and puts the
  output parameters on every remaining Q (``meta[QUANT_META]``), which the emitter writes
  as the tensor's quantization. What stays is float islands: ``DEQUANTIZE -> float ops ->
  QUANTIZE``, which compute exactly what the fake-quantized torch graph computes.

Targets: ``"onert"`` fuses FULLY_CONNECTED, ADD and MUL on uint8 (what onert 0.1.0 runs
correctly); RMS_NORM stays a float island (onert has no integer RMS_NORM). ``"npu"`` also
fuses RMS_NORM into one quantized op (uint8 or int8 input, gamma and output; an unweighted
norm gets a gamma of ones), for NPU compilers; no public runtime runs that file. Every
RMSNorm the npu target leaves float (and every mean of squares that did not fuse into one)
is noted, with why, in ``program.qdq_notes``, which ``summary()`` prints; so is, on
either target, every convolution the quantizer quantized that stays a float island (integer
convolutions are lowered for uint8 x uint8 per tensor only: the npu target's int16 ones stay float).
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..circle.schema import QuantParams
from ..errors import InputError
from ..fx_utils import arguments, fake_constant, fake_mode_of, make_node
from ..op_traits import CAST, VIEW
from ..dialect.nhwc import conv2d_nhwc
from ..fusions.linear_activation import linear_act
from ..source import source_line
from ..meta import DEQUANTIZED_FROM, QUANT_META, STORAGE_4BIT
from ..fusions.rms_norm import reduces_a_square, rms_norm
from ..program import add_constant, fetch_attr
from ..pass_protocol import Pass
from ..dialect import quantized as qops

aten = torch.ops.aten

TARGETS = ("onert", "npu")
_NS = "quantized_decomposed"


def _op(node) -> str:
    """``"quantize_per_tensor"`` for a ``quantized_decomposed`` node, else ``""``."""
    t = node.target if isinstance(node, fx.Node) and node.op == "call_function" else None
    if getattr(t, "namespace", None) != _NS:
        return ""
    return t._schema.name.split("::")[-1] if hasattr(t, "_schema") else ""


def is_q(node) -> bool:
    return _op(node) == "quantize_per_tensor" and node.target._overloadname == "default"


def is_dq(node) -> bool:
    return _op(node) == "dequantize_per_tensor" and node.target._overloadname == "default"


def has_qdq(program) -> bool:
    return any(_op(n) for n in program.gm.graph.nodes)


def bracket(program, pipeline: list, target: str | None) -> list:
    """``pipeline`` with :class:`QDQPrepare` before and :class:`QDQLower` after it when the
    graph holds Q/DQ nodes (target ``"onert"`` unless given); unchanged otherwise."""
    if not has_qdq(program):
        if target is not None:
            raise InputError(f"quant_target={target!r} was given, but the model has no quantize/dequantize "
                             "nodes; quantize it first (circle_fx.quant: prepare_pt2e -> calibrate -> convert_pt2e)")
        return pipeline
    target = check_target(target or "onert")
    return [QDQPrepare(target), *pipeline, QDQLower(target)]


def check_target(target) -> str:
    if target not in TARGETS:
        raise InputError(f"quant_target={target!r}: expected one of {', '.join(map(repr, TARGETS))}")
    return target


def _params(node):
    """``(scale, zero_point, dtype)`` of a per-tensor Q/DQ node (args: x, s, zp, qmin, qmax, dtype)."""
    _, s, zp, _, _, dt = node.args[:6]
    return float(s), int(zp), dt


#: 4-bit integer types (torch's shell dtypes: no tensor holds them) -> (their range, the dtype
#: that holds their values in the graph); a DQ of int8 / uint8 values inside such a range is
#: 4-bit, and its constant is stored packed (``circle/int4.py``)
FOUR_BIT = {torch.int4: ((-8, 7), torch.int8), torch.uint4: ((0, 15), torch.uint8)}


def _narrowed(dt: torch.dtype, qmin: int, qmax: int) -> torch.dtype:
    """``torch.int4`` / ``torch.uint4`` when a DQ of ``dt`` values declares a range that fits in
    4 bits (PT2E spells a 4-bit weight as int8 with ``quant_min=-8, quant_max=7``), else ``dt``."""
    for four, ((lo, hi), held) in FOUR_BIT.items():
        if dt == held and lo <= int(qmin) and int(qmax) <= hi:
            return four
    return dt


def _mark_4bit(const: fx.Node, dt: torch.dtype) -> fx.Node:
    """``const`` (the integers of a ``dt`` weight) marked for 4-bit storage when ``dt`` is 4-bit."""
    if dt in FOUR_BIT:
        const.meta[STORAGE_4BIT] = "INT4" if dt == torch.int4 else "UINT4"
    return const


def int_range(dt: torch.dtype) -> tuple[int, int]:
    """The values an integer dtype holds (the 4-bit ones included)."""
    if dt in FOUR_BIT:
        return FOUR_BIT[dt][0]
    info = torch.iinfo(dt)
    return info.min, info.max


def _dq_params(node) -> tuple[QuantParams, torch.dtype] | None:
    """The quantization a DQ node undoes, per tensor or per channel; its dtype is
    ``torch.int4`` / ``torch.uint4`` for a declared 4-bit range (:func:`_narrowed`)."""
    name = _op(node)
    if name == "dequantize_per_tensor" and node.target._overloadname == "default":
        s, zp, dt = _params(node)
        return QuantParams((s,), (zp,)), _narrowed(dt, *node.args[3:5])
    if name == "dequantize_per_channel":
        gm = node.graph.owning_module
        scales, zps, axis, dt = node.args[1], node.args[2], node.args[3], node.args[6]
        if not (isinstance(scales, fx.Node) and scales.op == "get_attr"):
            return None
        s = fetch_attr(gm, scales.target)
        z = fetch_attr(gm, zps.target) if isinstance(zps, fx.Node) else torch.zeros_like(s)
        return QuantParams(tuple(s.tolist()), tuple(int(v) for v in z.tolist()), int(axis)), \
            _narrowed(dt, *node.args[4:6])
    return None


class _TargetPass(Pass):
    """A Q/DQ pass that depends on the runtime it prepares for (``TARGETS``)."""

    def __init__(self, target: str = "onert"):
        super().__init__()
        self.target = check_target(target)


class QDQPrepare(_TargetPass):
    """Regularise Q/DQ nodes before the float pipeline (see the module docstring)."""

    name = "qdq_prepare"

    def run(self, program) -> bool:
        g = program.gm.graph
        changed = False
        if self.target == "onert":
            wide = next((n for n in g.nodes if is_q(n) and n.args[5] == torch.int16), None)
            if wide is not None:
                raise InputError(f"quant_target='onert': the model has int16 activations ({source_line(wide)}); "
                                 "onert 0.1.0 runs no int16 kernel: export them with quant_target='npu'")
            changed |= self._int8_to_uint8(g)
        for n in list(g.nodes):
            if is_q(n) and is_dq(n.args[0]) and n.args[1:] == n.args[0].args[1:]:
                n.replace_all_uses_with(n.args[0].args[0])  # Q(DQ(q)) == q exactly
                g.erase_node(n)
                changed = True
        order = {n: i for i, n in enumerate(g.nodes)}
        for n in list(g.nodes):
            if not getattr(n, "_erased", False):
                changed |= _merge_duplicates(n, is_q, order)
        for n in list(g.nodes):
            if is_q(n) and not getattr(n, "_erased", False):
                changed |= _merge_duplicates(n, is_dq, order)
        for n in g.nodes:
            p = _dq_params(n)
            if p is not None:
                n.meta[DEQUANTIZED_FROM] = p
        return changed

    @staticmethod
    def _int8_to_uint8(g: fx.Graph) -> bool:
        changed = False
        for q in list(g.nodes):
            if not is_q(q) or q.args[5] != torch.int8 or not all(is_dq(u) for u in q.users):
                continue
            x, s, zp, lo, hi, _ = q.args[:6]
            shifted = (s, zp + 128, lo + 128, hi + 128, torch.uint8)
            with g.inserting_before(q):
                q2 = make_node(g, q.target, (x, *shifted), like=q)
            for dq in list(q.users):
                with g.inserting_before(dq):
                    dq2 = make_node(g, dq.target, (q2, *shifted), dict(dq.kwargs), like=dq)
                dq.replace_all_uses_with(dq2)
                g.erase_node(dq)
            g.erase_node(q)
            changed = True
        return changed


def _merge_duplicates(value: fx.Node, kind, order: dict) -> bool:
    """Users of ``value`` that are ``kind`` nodes with equal arguments -> the earliest one."""
    seen: dict = {}
    changed = False
    users = sorted((u for u in value.users if kind(u) and u.args[0] is value), key=order.__getitem__)
    for u in users:
        key = (tuple(u.args[1:]), tuple(sorted(u.kwargs.items())))
        keep = seen.setdefault(key, u)
        if keep is not u:
            u.replace_all_uses_with(keep)
            u.graph.erase_node(u)
            changed = True
    return changed


# --------------------------------------------------------------------------- lowering

class QDQLower(_TargetPass):
    """``DQ -> op -> Q`` -> one quantized op where the target has a kernel; QUANT_META on Q."""

    name = "qdq_lower"

    def kinds(self) -> dict:
        fused = {aten.linear.default: qops.q_linear, aten.add.Tensor: qops.q_add, aten.mul.Tensor: qops.q_mul,
                 aten.embedding.default: qops.q_embedding, conv2d_nhwc: qops.q_conv2d}
        if self.target == "npu":
            fused[rms_norm] = qops.q_rms_norm
        else:  # a linear with a fused ReLU / ReLU6: onert's uint8 FC clamps its result exactly
            fused[linear_act] = qops.q_linear
        return fused

    def run(self, program) -> bool:
        g = program.gm.graph
        kinds = self.kinds()
        changed = _views_inside(g)
        self._refused: dict = {}  # rms_norm node -> why it stays float (npu target)
        for q in list(g.nodes):
            if not is_q(q) or getattr(q, "_erased", False):
                continue
            op = q.args[0]
            if not isinstance(op, fx.Node) or op.op != "call_function" or op.target not in kinds or len(op.users) != 1:
                continue
            new = self._fuse(program, q, op, kinds[op.target])
            if new is not None:
                q.replace_all_uses_with(new)
                g.erase_node(q)
                g.erase_node(op)
                changed = True
        if self.target == "npu":
            report_float_norms(program, self._refused)
        report_float_convs(program, self.target)
        for n in g.nodes:
            if is_q(n):
                s, zp, _ = _params(n)
                n.meta[QUANT_META] = QuantParams((s,), (zp,))
            elif is_dq(n) and n.args[0].op == "get_attr":
                s, zp, _ = _params(n)
                n.args[0].meta[QUANT_META] = QuantParams((s,), (zp,))
        return changed

    def _fuse(self, program, q, op, qop):
        out_s, out_zp, out_dt = _params(q)
        if not self._dtype_ok(out_dt):
            return None
        args = list(op.args)
        extra: list = []  # the op's non-tensor arguments, after the operands
        if op.target in (aten.linear.default, linear_act):
            x, w, b = (args + [None])[:3]
            if b is not None and not (isinstance(b, fx.Node) and b.op == "get_attr"):
                return None  # a bias computed at run time has no place in FULLY_CONNECTED
            operands = [self._operand(program, x, out_dt, constant_ok=False),
                        self._operand(program, w, out_dt, activation_ok=False)]
            if operands[1] is None and self.target == "npu":
                operands[1] = self._per_channel(program, w, out_dt)
                qop = qops.q_linear_pc if operands[1] is not None else qop
            extra = [b]
        elif op.target is conv2d_nhwc:
            x, w, b, *rest = arguments(op)
            if b is not None and not (isinstance(b, fx.Node) and b.op == "get_attr"):
                return None
            operands = [self._operand(program, x, out_dt, constant_ok=False),
                        self._operand(program, w, out_dt, activation_ok=False)]
            extra = [b, *rest]
        elif op.target is aten.embedding.default:
            w, ids = args[:2]
            table = self._operand(program, w, out_dt, activation_ok=False)
            # GATHER copies integers: exact only when the output shares the table's parameters
            if (table is None or not isinstance(ids, fx.Node)
                    or QuantParams(table[1:2], table[2:3]) != QuantParams((out_s,), (out_zp,))):
                return None
            operands, extra = [table], []
        elif op.target is rms_norm:
            x, w, eps = args
            xq = self._operand(program, x, out_dt, constant_ok=False)
            # unweighted: a gamma of ones, exact in any integer type (q = 1, scale 1)
            wq = self._operand(program, w, out_dt, activation_ok=False) if w is not None else \
                self._ones(program, op, out_dt)
            if xq is None or wq is None:
                self._refused[op] = _rms_refusal(x, w, out_dt, xq, wq)
                return None
            operands, extra = [xq, wq], [float(eps)]
        else:
            if (len(args) > 2 and args[2] != 1) or op.kwargs.get("alpha", 1) != 1:
                return None
            operands = [self._operand(program, a, out_dt) for a in args[:2]]
        if any(o is None for o in operands):
            return None
        flat = [v for o in operands for v in o] + extra
        if qop is qops.q_embedding:
            flat.append(args[1])  # the ids (not quantized)
        after = (args[3],) if op.target is linear_act and args[3] != "none" else ()  # the fused activation
        with op.graph.inserting_before(q):
            new = make_node(op.graph, qop, (*flat, out_s, out_zp, *after), like=op)
        new.meta[QUANT_META] = QuantParams((out_s,), (out_zp,))
        return new

    def _dtype_ok(self, dt) -> bool:
        return dt == torch.uint8 or (self.target == "npu" and dt in (torch.int8, torch.int16))

    @staticmethod
    def _matches(dt, dtype, weight: bool) -> bool:
        """Is an operand of type ``dt`` right for an op computing in ``dtype``? A weight
        (linear weight, gamma, table) of int16 activations is int8 (the 16x8 scheme) or
        int4 (16x4: a 4-bit weight, stored packed)."""
        return dt == dtype or (weight and dtype == torch.int16 and dt in (torch.int8, torch.int4))

    @staticmethod
    def _ones(program, op, dtype):
        """``(constant of ones [D], scale 1, zero point 0)`` in ``dtype``: the gamma of an
        unweighted RMSNorm."""
        d = op.args[0].meta["val"].shape[-1]
        return _int_constant(program, op, torch.ones(int(d), dtype=dtype), 1.0, 0, "rms_ones_q"), 1.0, 0

    def _per_channel(self, program, v, dtype):
        """``(integer weight, scales, zero points)`` (constants) of a linear weight quantized
        per output row, for ``q_linear_pc``; None if it is not one."""
        tag = v.meta.get(DEQUANTIZED_FROM) if isinstance(v, fx.Node) and v.op == "get_attr" else None
        if tag is None or not tag[0].per_channel or tag[0].axis != 0 or not self._matches(tag[1], dtype, True):
            return None
        qp, dt = tag
        real = fetch_attr(program.gm, v.target).float()
        scales = torch.tensor(qp.scale, dtype=torch.float32)
        zps = torch.tensor(qp.zero_point, dtype=torch.int32)
        lo, hi = int_range(dt)
        held = FOUR_BIT[dt][1] if dt in FOUR_BIT else dt
        ints = torch.clamp(torch.round(real / scales[:, None]) + zps[:, None], lo, hi).to(held)
        w = _int_constant(program, v, ints, 1.0, 0, f"{v.target}_q")
        w.meta[QUANT_META] = qp
        _mark_4bit(w, dt)
        consts = []
        for t, name in ((scales, "w_scales"), (zps, "w_zps")):
            with v.graph.inserting_before(v):
                c = v.graph.get_attr(add_constant(program.gm, t, f"{v.target}_{name}"))
            c.meta["val"] = fake_constant(v.graph, t)
            consts.append(c)
        return (w, *consts)

    def _operand(self, program, v, dtype, constant_ok=True, activation_ok=True):
        """``(integer tensor node, scale, zero point)`` for a dequantized operand, or None."""
        if not isinstance(v, fx.Node):
            return None
        if is_dq(v) and activation_ok:
            s, zp, dt = _params(v)
            return (v.args[0], s, zp) if dt == dtype else None
        if (constant_ok and v.op == "call_function" and v.target in CAST and isinstance(v.args[0], fx.Node)
                and v.args[0].op == "get_attr" and v.meta["val"].dtype.is_floating_point):
            v = v.args[0]  # a widening the fusion added after constant folding (a float16 gamma): same integers
        tag = v.meta.get(DEQUANTIZED_FROM)
        if v.op == "get_attr" and constant_ok and tag is not None:
            qp, dt = tag
            if qp.per_channel or not self._matches(dt, dtype, weight=not activation_ok):
                return None
            s, zp = qp.scale[0], qp.zero_point[0]
            real = fetch_attr(program.gm, v.target)
            # exact: real = (q - zp) * s in float32, |q - zp| <= 255
            if dt in FOUR_BIT:
                lo, hi = int_range(dt)
                ints = torch.clamp(torch.round(real * (1.0 / s)) + zp, lo, hi).to(FOUR_BIT[dt][1])
            else:
                ints = qops.quantize(real, s, zp, dt)
            return _mark_4bit(_int_constant(program, v, ints, s, zp, f"{v.target}_q"), dt), s, zp
        return None


def _views_inside(g: fx.Graph) -> bool:
    """Moves reshapes (``op_traits.VIEW``; permutes stay on the float side: onert 0.1.0 has no uint8
    TRANSPOSE) to the integer side of per-tensor Q/DQ nodes (``is_q`` / ``is_dq``):
    ``view(DQ(q)) -> DQ(view(q))`` and ``Q(view(y)) -> view(Q(y))`` (exact: one scale and zero
    point for every element). A 1-D convolution runs as a 2-D one over a unit height, so its
    input reaches it as ``unsqueeze(DQ(q))`` and its output leaves as ``Q(squeeze(conv))``:
    with the views outside, ``DQ -> conv -> Q`` is the chain the fusion looks for."""
    changed = False
    for v in list(g.nodes):
        if v.op != "call_function" or v.target not in VIEW or getattr(v, "_erased", False):
            continue
        src = v.args[0]
        if is_dq(src) and len(src.users) == 1:  # view(DQ(q)) -> DQ(view(q))
            with g.inserting_before(v):
                inner = make_node(g, v.target, (src.args[0], *v.args[1:]), dict(v.kwargs), like=v)
                dq = make_node(g, src.target, (inner, *src.args[1:]), dict(src.kwargs), like=src)
            dq.meta.update({k: m for k, m in src.meta.items() if k not in ("val",)})
            s, zp, _ = _params(src)
            inner.meta[QUANT_META] = QuantParams((s,), (zp,))  # integers, as the DQ's input was
            v.replace_all_uses_with(dq)
            g.erase_node(v)
            g.erase_node(src)
            changed = True
    for q in list(g.nodes):
        if not is_q(q) or getattr(q, "_erased", False):
            continue
        v = q.args[0]
        while (isinstance(v, fx.Node) and v.op == "call_function" and v.target in VIEW and len(v.users) == 1
               and len(q.users) > 0):  # Q(view(y)) -> view(Q(y))
            with g.inserting_before(q):
                inner = make_node(g, q.target, (v.args[0], *q.args[1:]), dict(q.kwargs), like=q)
                out = make_node(g, v.target, (inner, *v.args[1:]), dict(v.kwargs), like=v)
            s, zp, _ = _params(q)
            out.meta[QUANT_META] = QuantParams((s,), (zp,))
            q.replace_all_uses_with(out)
            g.erase_node(q)
            g.erase_node(v)
            q, v = inner, inner.args[0]
            changed = True
    return changed


def _int_constant(program, before: fx.Node, ints: torch.Tensor, s: float, zp: int, name: str) -> fx.Node:
    """A ``get_attr`` of the integer tensor ``ints`` (quantized with ``s``, ``zp``) before
    ``before``; when ``before`` is the float constant it replaces, with that one's meta."""
    name = add_constant(program.gm, ints, name)
    g = before.graph
    with g.inserting_before(before):
        c = g.get_attr(name)
    if before.op == "get_attr":
        c.meta.update({k: val for k, val in before.meta.items() if k != DEQUANTIZED_FROM})
    c.meta["val"] = fake_constant(g, ints)  # static: a constant's shape must not become symbolic
    c.meta[QUANT_META] = QuantParams((s,), (zp,))
    return c


# ------------------------------------------------------- norms the npu target leaves float

def _rms_refusal(x, w, dtype, xq, wq) -> str:
    if xq is None:
        if is_dq(x):
            return f"its input is {_params(x)[2]} but its output {dtype}"
        return "its input is not quantized"
    if w is not None and w.op == "get_attr":
        tag = w.meta.get(DEQUANTIZED_FROM)
        if tag is None:
            return "its gamma was not quantized (the quantizer saw no weight of this norm)"
        qp, dt = tag
        if qp.per_channel:
            return "its gamma is quantized per channel (RMS_NORM takes one scale)"
        return f"its gamma is {dt} but its output {dtype}"
    return "its gamma is computed at run time, not a constant"


def report_float_norms(program, refused: dict) -> None:
    """Note in ``program.qdq_notes`` every RMSNorm the ``npu`` target leaves float (with why), and
    every mean of squares that did not fuse into one, so ``summary()`` says where the file is
    not what an NPU with an integer RMS_NORM wants."""
    groups: dict[str, list[str]] = {}
    for n in program.gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target is rms_norm:
            why = refused.get(n)
            if why is None:
                out = list(n.users)
                why = ("its result is not quantized (CircleQuantizer quantizes RMSNorm units only with "
                       "quantize_elementwise=True)" if not (len(out) == 1 and is_q(out[0]))
                       else "its result's quantization has no integer kernel on the npu target")
            head = f"RMSNorm(s) stay float32 between DEQUANTIZE and QUANTIZE (no integer RMS_NORM): {why}"
        elif reduces_a_square(n):
            head = ("mean(s) of squares not fused into an RMSNorm (circle_fx.explain says why) stay float ops, "
                    "no integer RMS_NORM")
        else:
            continue
        groups.setdefault(head, []).append(source_line(n))
    notes = program.qdq_notes
    for head, where in groups.items():
        notes.append(f"quant_target='npu': {len(where)} {head}; at {', '.join(dict.fromkeys(where))}")


def _conv_refusal(conv: fx.Node) -> str | None:
    """Why a convolution whose operands the quantizer quantized was not fused into ``q_conv2d``
    (None: nothing of it is quantized, a float convolution by choice): every operand that is not
    what the integer lowering takes."""
    x, w = conv.args[0], conv.args[1]
    tag = w.meta.get(DEQUANTIZED_FROM) if isinstance(w, fx.Node) and w.op == "get_attr" else None
    if tag is None and not is_dq(x):
        return None
    problems = []
    if not is_dq(x):
        problems.append("its input is not dequantized (e.g. the float model input's layout permute)")
    elif _params(x)[2] != torch.uint8:
        problems.append(f"its input is {_params(x)[2]}")
    if tag is None:
        problems.append("its weight is not quantized")
    elif tag[1] != torch.uint8 or tag[0].per_channel:
        problems.append(f"its weight is {tag[1]} {'per channel' if tag[0].per_channel else 'per tensor'}")
    out = list(conv.users)
    if not (len(out) == 1 and is_q(out[0])):
        problems.append("its result is not quantized")
    if not problems:
        problems.append("its bias is computed at run time, not a constant")
    return "integer convolutions are lowered for uint8 input and weight per tensor only (q_conv2d): " + \
        ", ".join(problems)


def report_float_convs(program, target: str) -> None:
    """Note in ``program.qdq_notes`` every convolution the quantizer quantized (a dequantized input or
    weight) that ``QDQLower`` left float, with why: the file then has a float CONV_2D between
    DEQUANTIZE and QUANTIZE where the quantizer asked for an integer one."""
    groups: dict[str, list[str]] = {}
    for n in program.gm.graph.nodes:
        why = _conv_refusal(n) if n.op == "call_function" and n.target is conv2d_nhwc else None
        if why is not None:
            groups.setdefault(why, []).append(source_line(n))
    notes = program.qdq_notes
    for why, where in groups.items():
        notes.append(f"quant_target={target!r}: {len(where)} convolution(s) stay float32 between DEQUANTIZE "
                     f"and QUANTIZE: {why}; at {', '.join(dict.fromkeys(where))}")
