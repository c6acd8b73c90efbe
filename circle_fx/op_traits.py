"""What an FX op *is*, in one table: the traits every pass asks about instead of keeping its own
set of aten targets.

A pass that needs "ops computed element by element" or "ops that only move elements" asks
``op_traits.ELEMENTWISE`` / ``op_traits.MOVEMENT`` (``target in TRAIT`` or ``TRAIT.of(node)``).
Before this table each pass kept its own set, and the copies disagreed: a new elementwise op
had to be added to lists nobody named, and a fused op (``circle.silu``) that was not in the
layout pass's list made a CNN's NHWC permutes stop at it (2 TRANSPOSEs became 4).

Custom ``circle::`` ops declare their traits where they are defined
(``circle_fx.dialect.define(..., traits=(ELEMENTWISE,))``), which adds them here: a trait is a
*live* set, and unions (``VIEW | PERMUTE``) are views over their parts, so an op declared after
import is seen by every pass. ``tests/test_op_traits.py`` checks that no module outside this one
binds a set of aten targets.

Each trait's docstring says what its members guarantee; the users rely on exactly that.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch

import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines torch.ops.quantized_decomposed.*)

aten = torch.ops.aten
_qd = torch.ops.quantized_decomposed


#: bumped by every ``Trait.add``: unions rebuild their flattened members lazily
_version = [0]


class Trait:
    """A named, growing set of FX call targets (``in`` / ``of(node)`` / iteration / ``|``)."""

    def __init__(self, name: str, doc: str, targets: Iterable = (), parts: tuple = ()):
        self.name, self.doc = name, doc
        self._own: set = set(targets)
        self._parts = parts
        self._flat, self._flat_version = frozenset(), -1

    def _members(self) -> frozenset:
        """Own targets and every part's, recomputed only after an ``add`` anywhere (passes ask
        membership in hot loops: one frozenset lookup)."""
        if self._flat_version != _version[0]:
            self._flat = frozenset(self._own).union(*(p._members() for p in self._parts))
            self._flat_version = _version[0]
        return self._flat

    def __contains__(self, target) -> bool:
        return target in self._members()

    def __iter__(self) -> Iterator:
        return iter(self._members())

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __or__(self, other) -> "Trait":
        other = other if isinstance(other, Trait) else Trait("", "", other)  # (a plain set: fixed)
        return Trait(f"{self.name}|{other.name}", "", parts=(self, other))

    def of(self, node) -> bool:
        """``node`` is a ``call_function`` node whose target has this trait."""
        return getattr(node, "op", None) == "call_function" and node.target in self

    def add(self, target) -> None:
        if self._parts:
            raise TypeError(f"trait {self.name} is a union of {[p.name for p in self._parts]}: add to a part")
        self._own.add(target)
        _version[0] += 1

    def discard(self, target) -> None:
        """Take ``target`` out (tests show what a pass does without the trait)."""
        self._own.discard(target)
        _version[0] += 1

    def __repr__(self) -> str:
        return f"Trait({self.name}, {len(self)} ops)"


def _trait(name: str, doc: str, *targets, parts: tuple = ()) -> Trait:
    t = Trait(name, doc, targets, parts)
    TRAITS[name] = t
    return t


#: every trait by name (``dialect.define(traits=...)`` accepts names or Trait objects)
TRAITS: dict[str, Trait] = {}

# ------------------------------------------------------------------ no-ops and casts

CAST = _trait("cast", "Only re-tag a value's dtype or device: matched through and removed when no-ops.",
              aten.to.dtype, aten.to.dtype_layout, aten._to_copy.default, aten.type_as.default, aten.to.device)
IDENTITY = _trait("identity", "Return their first argument's values unchanged (in inference): dropout, clone, alias...",
                  aten.alias.default, aten.clone.default, aten.contiguous.default, aten.detach.default,
                  aten.lift_fresh_copy.default, aten.dropout.default)
SIDE_EFFECT_ONLY = _trait("side_effect_only", "Assertions: no value, kept only while something needs the check.",
                          aten._assert_tensor_metadata.default, aten._assert_scalar.default,
                          aten.sym_constrain_range_for_size.default)

# ------------------------------------------------------------------ data movement

RESHAPE = _trait("reshape", "View ops whose second argument is the full target shape (symbolic dims allowed).",
                 aten.view.default, aten.reshape.default, aten._unsafe_view.default)
VIEW = _trait("view", "Change only the dims, never the element order (a reshape of the flat data).",
              aten.unsqueeze.default, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims,
              aten.flatten.using_ints, aten.unflatten.int, parts=(RESHAPE,))
PERMUTE = _trait("permute", "Reorder the dims (a TRANSPOSE): `fold_views.permutation` gives the order.",
                 aten.permute.default, aten.transpose.int, aten.t.default)
EXPAND = _trait("expand", "Repeat the input along size-1 (or new leading) dims: each output element is one input element.",
                aten.expand.default, aten.expand_as.default, aten.broadcast_to.default)
MOVEMENT = _trait("movement", "Each output element is one input element, all input elements kept "
                  "(the pattern language's `moved` sees through chains of them).", parts=(VIEW, PERMUTE, EXPAND))
SELECTION = _trait("selection", "A sub-block of the input along one dim (`op(x, dim, ...)`).",
                   aten.slice.Tensor, aten.select.int)
VALUE_PRESERVING = _trait("value_preserving", "Every output value is an input value (moved, repeated or selected; "
                          "facts about values such as non-negativity carry through).", parts=(MOVEMENT, SELECTION))

# ------------------------------------------------------------------ computation

ELEMENTWISE = _trait(
    "elementwise", "Computed element by element, tensor operands broadcast, any other argument a scalar: "
    "a permute commutes with them, rows stay apart, a value repeated along a dim stays repeated.",
    aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.add.Scalar, aten.sub.Scalar,
    aten.mul.Scalar, aten.div.Scalar, aten.rsub.Scalar, aten.rsub.Tensor, aten.maximum.default, aten.minimum.default,
    aten.pow.Tensor_Scalar, aten.relu.default, aten.hardtanh.default, aten.clamp.default, aten.clamp_min.default,
    aten.clamp_max.default, aten.sigmoid.default, aten.tanh.default, aten.gelu.default, aten.silu.default,
    aten.hardswish.default, aten.hardsigmoid.default, aten.leaky_relu.default, aten.elu.default, aten.neg.default,
    aten.exp.default, aten.abs.default, aten.sqrt.default, aten.rsqrt.default, aten.reciprocal.default,
    aten.erf.default, aten.where.self, aten._to_copy.default, aten.to.dtype, aten.mish.default,
    aten.ne.Scalar, aten.eq.Scalar, aten.lt.Scalar, aten.le.Scalar, aten.gt.Scalar, aten.ge.Scalar,
    # per-tensor quantize / dequantize (PT2E): one scale and zero point for every element
    _qd.quantize_per_tensor.default, _qd.dequantize_per_tensor.default)
ARITHMETIC = _trait("arithmetic", "`a + alpha * b`, `a - alpha * b`, `a * b` of two tensors.",
                    aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor)
COMMUTATIVE = _trait("commutative", "Binary ops whose two tensor operands may be swapped (the matcher tries both).",
                     aten.add.Tensor, aten.mul.Tensor)
SQUARING = _trait("squaring", "Can compute `x * x` (`pow(x, 2)`, `mul(x, x)`, `square`): an RMSNorm's mean square.",
                  aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.mul.Tensor, aten.square.default)
RELU = _trait("relu", "ReLU / ReLU6 with no bound arguments (in-place forms included, as PT2E graphs keep them).",
              aten.relu.default, aten.relu_.default, aten.relu6.default)
CLAMP = _trait("clamp", "Clamp to `(args[1], args[2])` (`hardtanh(0, 6)` and `clamp(0, 6)` are a ReLU6).",
               aten.hardtanh.default, aten.hardtanh_.default, aten.clamp.default)

# ------------------------------------------------------------------ axis-wise

REDUCTION = _trait("reduction", "`op(x, dims, keepdim, ...)` reducing the listed dims.",
                   aten.mean.dim, aten.sum.dim_IntList, aten.amax.default, aten.amin.default)
FULL_REDUCTION = _trait("full_reduction", "May reduce every element to one (`op(x)` or empty dims): "
                        "the order of the elements does not matter.",
                        aten.mean.default, aten.sum.default, aten.amax.default, aten.amin.default)
SUMMING = _trait("summing", "Reductions that add their elements (sum, mean): linear in the input.",
                 aten.mean.dim, aten.sum.dim_IntList, aten.mean.default, aten.sum.default)
SOFTMAX = _trait("softmax", "`op(x, dim, ...)`: (log-)softmax along one dim; each slice along it on its own.",
                 aten._softmax.default, aten._log_softmax.default, aten.softmax.int, aten.log_softmax.int)
ALONG_AXIS = _trait("along_axis", "`op(x, dim, ...)` computed along one dim, result of `x`'s shape.",
                    aten.cumsum.default, parts=(SOFTMAX,))
AXIS_SIZED = _trait("axis_sized", "`op(x, dim, ...)` keeping the rank and changing only that dim's length.",
                    aten.slice.Tensor, aten.index_select.default)
SPLIT = _trait("split", "`op(x, sizes, dim)` returning a list of pieces along `dim` (read through `getitem`).",
               aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default)
ARANGE = _trait("arange", "Positions counted up from a start (never negative when the start is not).",
                aten.arange.default, aten.arange.start, aten.arange.start_step)

POSITION = _trait("position", "`(op, output index or None)` whose result is a position along a dim, never negative.",
                  (aten.topk.default, 1), (aten.sort.default, 1), (aten.max.dim, 1), (aten.min.dim, 1),
                  (aten.argmax.default, None), (aten.argmin.default, None))

FFT = _trait("fft", "Discrete Fourier transforms over given dims (`fft_fft`, `fft_fft2`, `fft_fftn`).",
              aten.fft_fft.default, aten.fft_fft2.default, aten.fft_fftn.default)
COMPLEX_PARTS = _trait("complex_parts", "Convert between a complex tensor and real ones (its parts, polar form).",
                       aten.view_as_complex.default, aten.view_as_real.default, aten.polar.default,
                       aten.real.default, aten.imag.default)

# ------------------------------------------------------------------ circle_fx's own decisions

APPROXIMATED = _trait("approximated", "Decomposed only approximately (no exact Circle form): the decompose pass "
                      "defers them past the fusions so a fusion sees the op itself.",
                      aten.erf.default, aten.acos.default, aten.asin.default)


def declare(target, traits: Iterable) -> None:
    """Give ``target`` (a custom op) ``traits`` (Trait objects or their names)."""
    for t in traits:
        trait = TRAITS[t] if isinstance(t, str) else t
        if not isinstance(trait, Trait):
            raise TypeError(f"{t!r} is not an op trait; known: {sorted(TRAITS)}")
        trait.add(target)


def traits_of(target) -> list[str]:
    """The names of the (non-union) traits ``target`` has."""
    return [name for name, t in TRAITS.items() if not t._parts and target in t]
