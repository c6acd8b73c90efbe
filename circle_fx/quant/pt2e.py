"""``CircleQuantizer``: a torchao PT2E quantizer for what Circle runtimes run quantized.

    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e, convert_pt2e
    gm = torch.export.export(model, inputs).module()
    prepared = prepare_pt2e(gm, CircleQuantizer())
    for batch in calibration: prepared(*batch)
    converted = convert_pt2e(prepared)
    cm = circle_fx.export(converted, inputs, quant_target="onert")

What it annotates (uint8, asymmetric, per tensor — onert 0.1.0's only correct fully
quantized type; its FULLY_CONNECTED is uint8 x uint8 only):

- ``linear``: input, weight and output (the bias stays float; the exporter makes it int32), the
  output after a ReLU / ReLU6 that reads only it (uint8 activations: the ``linear_activation``
  family fuses it and onert's uint8 FULLY_CONNECTED clamps its result exactly, measured in
  ``benchmarks/onert_fc_activation.py``);
- ``embedding``: the table, with the output sharing its parameters (an integer GATHER);
- ``conv2d`` and ``conv1d`` (run as a 2-D one over a unit height): input, weight (uint8 per tensor: onert 0.1.0's uint8 CONV_2D / DEPTHWISE_CONV_2D
  are exact, an int8 weight under uint8 activations silently wrong, measured in
  ``benchmarks/onert_conv_int8.py``) and output, the output after a ReLU / ReLU6 that reads only
  it (the activation Circle fuses into the convolution; ``prepare_pt2e`` folds BatchNorms
  into the convolutions first), the bias float (the exporter makes it int32); a zero padding in front (TF-style) is
  quantized at its input instead, so it folds into the convolution;
- only with ``quantize_elementwise=True``: ``add`` / ``mul`` of two tensors (both inputs and
  the output) and every **RMSNorm as one unit**: its input, its weight and its output, never
  its interior (``pow``, ``mean``, ``rsqrt`` and the muls inside stay float), so that after
  ``convert_pt2e`` the norm is ``DQ -> float RMSNorm -> Q`` and circle_fx fuses it to one
  ``circle.rms_norm`` whose input, weight and output carry quantization parameters.

Why elementwise ops are float by default: a trained LLM's residual stream (every ``add``
between blocks, and the RMSNorm input) spans about 25,000 in a few outlier channels
(SmolLM2-135M), so one uint8 step would be ~100 and the model collapses (perplexity
18 -> 150,000). The field keeps the residual stream, RMSNorm and softmax in higher
precision and quantizes the linear layers; on the onert target the unannotated ops are
float islands between DEQUANTIZE and QUANTIZE.

Activation observers (``activation_observer``), all per tensor: ``"minmax"`` (the range
seen), ``"percentile"`` (:class:`PercentileObserver`, clips the rare outliers of each
batch), ``"mse"`` (torchao's ``HistogramObserver``: the range that minimises the L2
quantization error of the calibration histogram). ``benchmarks/pt2e_accuracy.py``
measures them on SmolLM2-135M; the default is the best one there.

Which subgraphs are RMSNorms is decided by circle_fx's own RMSNorm fusion, run on a copy of
the graph (:func:`rms_norm_units`): the quantizer treats as a unit exactly what the float
exporter would fuse, so a near miss gets ordinary per-op annotations (and then does not
fuse), and a genuine RMSNorm in any spelling gets one unit. Its weight is whatever constant
expression the interior reads (Gemma's ``1 + w``, a float16 weight), observed as the
gamma, so on the npu target every spelling becomes one integer RMS_NORM.

Ops whose inputs are all constants are not annotated (constant folding removes them).
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import torch
import torch.fx as fx
from torchao.quantization.pt2e.observer import HistogramObserver, MinMaxObserver, PerChannelMinMaxObserver
from torchao.quantization.pt2e.quantizer import (QuantizationAnnotation, QuantizationSpec, Quantizer,
                                                 SharedQuantizationSpec)

from ..errors import InputError
from ..fx_utils import is_noop
from ..op_traits import CAST, CLAMP, IDENTITY, RELU, SIDE_EFFECT_ONLY
from ..fusions.rms_norm import rms_norm
from ..program import Program

aten = torch.ops.aten
LINEAR_OUTPUTS = ("quantized", "float")
_ANNOTATION = "quantization_annotation"


def uint8_spec(observer=MinMaxObserver) -> QuantizationSpec:
    """uint8 [0, 255], asymmetric, per tensor."""
    return QuantizationSpec(dtype=torch.uint8, quant_min=0, quant_max=255, qscheme=torch.per_tensor_affine,
                            observer_or_fake_quant_ctr=observer.with_args(eps=2 ** -12))


class PercentileObserver(MinMaxObserver):
    """Min/max of the ``percentile`` and ``100 - percentile`` quantiles of each calibration
    batch (the widest over batches): a handful of outlier values no longer set the scale
    for all the others. Quantiles by ``kthvalue`` (``torch.quantile`` refuses > 16M values)."""

    def __init__(self, percentile: float = 99.99, **kwargs):
        super().__init__(**kwargs)
        self.percentile = percentile

    def forward(self, x_orig):
        if x_orig.numel() == 0:
            return x_orig
        x = x_orig.detach().reshape(-1).to(self.min_val.dtype)
        n = x.numel()
        k = max(1, min(n, int(round(n * (1 - self.percentile / 100)))))
        lo = torch.kthvalue(x, k).values if k > 1 else x.min()
        hi = torch.kthvalue(x, n - k + 1).values if k > 1 else x.max()
        self.min_val.copy_(torch.min(lo, self.min_val))
        self.max_val.copy_(torch.max(hi, self.max_val))
        return x_orig


#: module-path globs :class:`CircleQuantizer` keeps float unless told otherwise (its docstring says why)
DEFAULT_SKIP = ("*mlp.down_proj",)

#: ``activation_observer`` names -> observer classes (see the module docstring)
OBSERVERS = {"minmax": MinMaxObserver, "percentile": PercentileObserver, "mse": HistogramObserver}


@dataclass(frozen=True)
class RmsUnit:
    """One RMSNorm in the quantizer's graph: ``input`` and ``weight`` (None when
    unweighted or not a plain tensor) feed ``interior``, whose last node ``output`` is the
    normalised result."""

    input: fx.Node
    weight: fx.Node | None
    output: fx.Node
    interior: tuple[fx.Node, ...]


def int16_spec(observer=MinMaxObserver) -> QuantizationSpec:
    """int16, symmetric (zero point 0), per tensor: the activations of NPU toolchains' LLM
    schemes (a residual stream spanning ~25,000 keeps a step below 1)."""
    return QuantizationSpec(dtype=torch.int16, quant_min=-32768, quant_max=32767, qscheme=torch.per_tensor_symmetric,
                            observer_or_fake_quant_ctr=observer.with_args(eps=2 ** -20))


def int8_weight_spec(per_channel: bool = False) -> QuantizationSpec:
    """int8 weights, symmetric in [-127, 127] (zero point 0), per tensor or per output row."""
    if per_channel:
        return QuantizationSpec(dtype=torch.int8, quant_min=-127, quant_max=127, qscheme=torch.per_channel_symmetric,
                                ch_axis=0, observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args(eps=2 ** -12))
    return QuantizationSpec(dtype=torch.int8, quant_min=-127, quant_max=127, qscheme=torch.per_tensor_symmetric,
                            observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=2 ** -12))


#: ``activation_dtype`` values of :class:`CircleQuantizer`
ACTIVATION_DTYPES = ("uint8", "int16")
#: ``weight_bits`` values of :class:`CircleQuantizer`
WEIGHT_BITS = (8, 4)
#: module-path globs whose linears keep 8-bit weights when ``weight_bits=4`` (the output
#: projection: llama.cpp keeps ``output.weight`` at Q6_K for Q4_0; a tied one is also the table)
DEFAULT_KEEP_8BIT = ("*lm_head",)


def int4_weight_spec(scales: torch.Tensor | None = None) -> QuantizationSpec:
    """4-bit weights: int8 values in [-8, 7] (what the exporter stores as Circle ``INT4``, two per
    byte), symmetric, one scale per output row; ``scales``: the given per-row scales (GPTQ's) and
    no observation (:class:`GivenScalesObserver`), else min/max per row."""
    ctr = (GivenScalesObserver.with_args(scales=scales) if scales is not None
           else PerChannelMinMaxObserver.with_args(eps=2 ** -12))
    return QuantizationSpec(dtype=torch.int8, quant_min=-8, quant_max=7, qscheme=torch.per_channel_symmetric,
                            ch_axis=0, observer_or_fake_quant_ctr=ctr)


class GivenScalesObserver(PerChannelMinMaxObserver):
    """A per-channel weight observer that reports scales fixed in advance (zero points 0): the
    weight was already rounded onto them (GPTQ), so ``convert_pt2e`` recovers its integers
    exactly instead of re-deriving a scale from the rounded weight's range."""

    def __init__(self, scales: torch.Tensor, **kwargs):
        super().__init__(**kwargs)
        self.register_buffer("given_scales", scales.detach().float().clone())

    def calculate_qparams(self):
        return self.given_scales.clone(), torch.zeros(self.given_scales.shape, dtype=torch.int64)


def uint8_per_channel_spec() -> QuantizationSpec:
    """uint8 weights, asymmetric, one scale and zero point per output row (axis 0)."""
    return QuantizationSpec(dtype=torch.uint8, quant_min=0, quant_max=255, qscheme=torch.per_channel_affine,
                            ch_axis=0, observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args(eps=2 ** -12))


class CircleQuantizer(Quantizer):
    """Annotate linears and embeddings (and, optionally, add, mul and RMSNorm units) for
    static uint8 quantization.

    - ``activation_observer``: ``"minmax"``, ``"percentile"`` or ``"mse"`` (module docstring).
    - ``quantize_elementwise``: also quantize ``add``/``mul`` of two tensors and RMSNorm units
      (residual stream included). Off by default: it ruins trained LLMs (module docstring).
    - ``per_channel_weights``: one scale per output row of each linear weight. onert 0.1.0's
      integer FULLY_CONNECTED is per tensor only, so there such a linear becomes a float
      island (dequantized weight, float FC); for NPU compilers that run per-channel FC.
    - ``skip``: ``fnmatch`` globs of module paths (``model.layers.0.mlp.down_proj``, from
      ``torch.export``'s ``nn_module_stack``) whose linears stay float. Default
      :data:`DEFAULT_SKIP`: the gated MLP's output projection, whose input (``silu(gate) *
      up``) and output (written straight into the residual stream) carry a trained LLM's
      massive activations; measured on SmolLM2-135M (``benchmarks/pt2e_accuracy.py``), it
      alone accounts for most of the loss. ``skip=()`` quantizes every linear.
    - ``linear_outputs``: ``"quantized"`` (default: each linear's output is uint8 too) or
      ``"float"``: inputs and weights uint8, the output left float (W8A8 with a float accumulator
      output, as SmoothQuant-style LLM kernels emit). onert then runs each quantized linear as a
      float island (DEQUANTIZE -> float FULLY_CONNECTED, no QUANTIZE after it). Measured on
      SmolLM2-135M (``benchmarks/pt2e_localize.py``): every quantized output is a point where a
      last-bit float difference between runtimes becomes a whole step, which each later linear
      multiplies ~10x; without them the onert file departs from its reference 3 layers later
      and drifts ~3x per layer instead (benchmarks/README.md, issue 18).
    - ``activation`` / ``weight``: explicit :class:`QuantizationSpec` overrides (the onert
      target needs uint8 per tensor for integer kernels; anything else is a float island).
    - ``activation_dtype``: ``"uint8"`` (above) or ``"int16"``, the NPU scheme for LLMs:
      int16 symmetric activations, int8 symmetric weights (and embedding table), and by
      default ``quantize_elementwise=True``, ``skip=()`` (residual adds, RMSNorms and every
      linear integer: int16 has the range) and ``per_channel_weights=True`` (the npu
      target's FULLY_CONNECTED takes per-row scales; measured on SmolLM2-135M, 128 tokens:
      perplexity +4 % over float with per-row int8 weights, +14 % per tensor). Only for
      ``quant_target="npu"``: onert 0.1.0 runs no int16 kernel; the file is checked
      against a numpy reference of its operators (``circle_fx.circle.reference``).
    - ``weight_bits``: 8 (default) or 4 (int16 activations only: the npu target's 16x4 linears).
      With 4, every linear but those matching ``keep_8bit`` (default :data:`DEFAULT_KEEP_8BIT`)
      gets int8-held values in [-8, 7], one scale per output row, stored as Circle ``INT4``
      (two per byte). ``gptq=True`` (needs ``calibration=``) rounds those weights by GPTQ over
      the calibration Hessians before annotation (:mod:`circle_fx.quant.gptq_graph`) and the
      observers take its scales; without it they are rounded to nearest from each row's range
      (measured on SmolLM2-135M, ``benchmarks/npu_int16_accuracy.py --only int4``: ruinous at 4 bits).
    - ``smooth_quant``: SmoothQuant's ``alpha`` (0..1; None: off) and ``calibration`` (an
      iterable of input tuples, e.g. the batches later run through the prepared model): before
      annotation, ``prepare_pt2e`` then fuses the RMSNorms and folds per-channel scales into the
      norms' gammas and the linears' weights (:mod:`circle_fx.quant.smooth`; no op is added,
      the float model computes the same). Measured on SmolLM2-135M in
      ``benchmarks/pt2e_accuracy.py``. ``smooth_kinds``: which folds (``"rms_norm"``,
      ``"up_proj"``, ``"v_proj"``; default all, ``circle_fx.quant.smooth.KINDS``).
    """

    def __init__(self, activation: QuantizationSpec | None = None, weight: QuantizationSpec | None = None, *,
                 activation_observer: str = "minmax", quantize_elementwise: bool | None = None,
                 per_channel_weights: bool | None = None, skip: tuple[str, ...] = None,
                 activation_dtype: str = "uint8", smooth_quant: float | None = None, calibration=None,
                 smooth_kinds: tuple[str, ...] | None = None, linear_outputs: str = "quantized",
                 weight_bits: int = 8, gptq: bool = False, keep_8bit: tuple[str, ...] = DEFAULT_KEEP_8BIT):
        super().__init__()
        if weight_bits not in WEIGHT_BITS:
            raise InputError(f"CircleQuantizer(weight_bits={weight_bits!r}): expected one of "
                             f"{', '.join(map(repr, WEIGHT_BITS))}")
        if weight_bits == 4 and (activation_dtype != "int16" or weight is not None):
            raise InputError("CircleQuantizer(weight_bits=4) is the npu target's 16x4 scheme: it needs "
                             "activation_dtype='int16' and no explicit weight spec")
        if gptq and (weight_bits != 4 or calibration is None):
            raise InputError("CircleQuantizer(gptq=True) rounds 4-bit weights: it needs weight_bits=4 and "
                             "calibration=[input tuples] (the Hessians come from them)")
        self.weight_bits, self.gptq = weight_bits, gptq
        self.keep_8bit = tuple((keep_8bit,) if isinstance(keep_8bit, str) else keep_8bit)
        #: weight attribute name -> the per-row scales GPTQ rounded it onto (after prepare)
        self.gptq_scales: dict[str, torch.Tensor] = {}
        if linear_outputs not in LINEAR_OUTPUTS:
            raise InputError(f"CircleQuantizer(linear_outputs={linear_outputs!r}): expected one of "
                             f"{', '.join(map(repr, LINEAR_OUTPUTS))}")
        self.linear_outputs = linear_outputs
        if smooth_quant is not None and calibration is None:
            raise InputError("CircleQuantizer(smooth_quant=...) needs calibration=[input tuples] "
                             "(the per-channel activation maxima the scales come from)")
        self.smooth_quant, self.calibration, self.smooth_kinds = smooth_quant, calibration, smooth_kinds
        #: the groups SmoothQuant rescaled (``circle_fx.quant.smooth.SmoothGroup``), after prepare
        self.smoothed = []
        if activation_dtype not in ACTIVATION_DTYPES:
            raise InputError(f"CircleQuantizer(activation_dtype={activation_dtype!r}): expected one of "
                             f"{', '.join(map(repr, ACTIVATION_DTYPES))}")
        int16 = activation_dtype == "int16"
        self._int16 = int16
        if skip is None:
            skip = () if int16 else DEFAULT_SKIP
        self.skip = tuple((skip,) if isinstance(skip, str) else skip)
        if activation_observer not in OBSERVERS:
            raise InputError(f"CircleQuantizer(activation_observer={activation_observer!r}): expected one of "
                             f"{', '.join(map(repr, OBSERVERS))}")
        observer = OBSERVERS[activation_observer]
        self.activation = activation or (int16_spec(observer) if int16 else uint8_spec(observer))
        if per_channel_weights is None:
            per_channel_weights = int16
        if weight is None:
            weight = int8_weight_spec(per_channel_weights) if int16 else (
                uint8_per_channel_spec() if per_channel_weights else uint8_spec())
        self.weight = weight
        self.quantize_elementwise = int16 if quantize_elementwise is None else quantize_elementwise

    def transform_for_annotation(self, model: fx.GraphModule) -> fx.GraphModule:
        if self.smooth_quant is not None:
            from .smooth import smooth_quant

            from .smooth import KINDS

            self.smoothed = smooth_quant(model, self.calibration, self.smooth_quant, KINDS if self.smooth_kinds is None else self.smooth_kinds)
        if self.gptq:
            from .gptq_graph import gptq_linears

            self.gptq_scales = gptq_linears(model, self.calibration, self._four_bit, -8, 7)
        return model

    def _four_bit(self, linear: fx.Node) -> bool:
        """Does this linear get a 4-bit weight (``weight_bits=4``, not kept at 8 bits, not skipped)?"""
        return self.weight_bits == 4 and not self._skipped(linear) and not self._matches(linear, self.keep_8bit)

    def _linear_weight(self, linear: fx.Node) -> QuantizationSpec:
        if not self._four_bit(linear):
            return self.weight
        w = linear.args[1]
        given = self.gptq_scales.get(w.target) if isinstance(w, fx.Node) and w.op == "get_attr" else None
        return int4_weight_spec(given)

    def annotate(self, model: fx.GraphModule) -> fx.GraphModule:
        constant = _constant_nodes(model.graph)
        if self.quantize_elementwise:
            for unit in rms_norm_units(model):
                self._annotate_unit(unit)
        for n in model.graph.nodes:
            if n.op != "call_function" or _ANNOTATION in n.meta or n in constant or not _is_float(n):
                continue
            if n.target is aten.linear.default:
                x, w = n.args[0], n.args[1]
                if x in constant or not _is_float(x) or not _is_float(w) or self._skipped(n):
                    continue
                act = _fusable_activation(n) if self.linear_outputs == "quantized" and not self._int16 else None
                self._annotate(n, {x: self.activation, w: self._linear_weight(n)},
                               self.activation if self.linear_outputs == "quantized" and act is None else None)
                if act is not None:  # quantized after the ReLU / ReLU6, which FULLY_CONNECTED applies
                    self._annotate(act, {}, self.activation)
            elif n.target in (aten.conv2d.default, aten.conv1d.default):  # a 1-D one runs as 2-D
                x, w = n.args[0], n.args[1]
                if x in constant or not _is_float(x) or not _is_float(w) or w not in constant or self._skipped(n):
                    continue
                act = _fusable_activation(n)
                pad = _zero_pad(x)
                if pad is not None:  # quantized before the pad, which then folds into the convolution
                    self._annotate(pad, {pad.args[0]: self.activation}, None)
                inputs = {w: self.weight} if pad is not None else {x: self.activation, w: self.weight}
                self._annotate(n, inputs, None if act is not None else self.activation)
                if act is not None:
                    self._annotate(act, {}, self.activation)
            elif n.target is aten.embedding.default:
                w = n.args[0]
                if _is_float(w):  # the rows come out with the table's parameters: GATHER stays integer
                    self._annotate(n, {w: self._per_tensor_weight()}, SharedQuantizationSpec((w, n)))
            elif n.target in (aten.add.Tensor, aten.mul.Tensor) and len(n.args) >= 2 and self.quantize_elementwise:
                a, b = n.args[0], n.args[1]
                alpha = n.kwargs.get("alpha", 1)
                if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)) or alpha != 1:
                    continue
                if not (_is_float(a) and _is_float(b)):
                    continue
                self._annotate(n, {a: self.activation, b: self.activation}, self.activation)
        return model

    def _skipped(self, node: fx.Node) -> bool:
        return self._matches(node, self.skip)

    @staticmethod
    def _matches(node: fx.Node, globs) -> bool:
        """Does the innermost module path of ``node`` match one of ``globs``?"""
        stack = node.meta.get("nn_module_stack") or {}
        paths = [v[0] for v in stack.values() if isinstance(v, tuple) and v]
        return bool(paths) and any(fnmatch.fnmatchcase(paths[-1], pat) for pat in globs)

    def _per_tensor_weight(self) -> QuantizationSpec:
        """The weight spec, per tensor: for an embedding table (its rows come out sharing its
        one scale) and an RMSNorm gamma (RMS_NORM takes one scale; 1-D, no rows to scale)."""
        if self.weight.qscheme in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            return self.weight
        return int8_weight_spec() if self.weight.dtype == torch.int8 else uint8_spec()

    def validate(self, model: fx.GraphModule) -> None:
        pass

    @staticmethod
    def _annotate(node, inputs: dict, output) -> None:
        node.meta[_ANNOTATION] = QuantizationAnnotation(input_qspec_map=inputs, output_qspec=output, _annotated=True)

    def _annotate_unit(self, unit: RmsUnit) -> None:
        first_edge = None
        for n in unit.interior:
            inputs = {}
            if unit.input in n.args:
                if first_edge is None:
                    first_edge = (unit.input, n)
                    inputs[unit.input] = self.activation
                else:  # one observer for every read of the input: one Q node after convert
                    inputs[unit.input] = SharedQuantizationSpec(first_edge)
            if unit.weight is not None and unit.weight in n.args:
                inputs[unit.weight] = self._per_tensor_weight()
            self._annotate(n, inputs, self.activation if n is unit.output else None)


# ------------------------------------------------------------------- finding the units

def rms_norm_units(model: fx.GraphModule) -> list[RmsUnit]:
    """The RMSNorms circle_fx's float pipeline would fuse, as nodes of ``model``'s graph.

    Runs decompose, canonicalize, constant folding and the RMSNorm fusion on a copy of the
    graph (the model's own graph is not touched) and maps each fused node back: its input
    and weight through the node copies, its output through the users of the fused node.
    """
    from ..fusions import get_family
    from ..passes import Canonicalize, DeadCodeElimination, FoldConstants, decompose_passes, FusePatterns

    graph = fx.Graph()
    copies: dict[fx.Node, fx.Node] = {}
    out = graph.graph_copy(model.graph, copies)
    graph.output(out)
    originals = {c: o for o, c in copies.items()}
    originals[graph.output_node()] = model.graph.output_node()
    constant = _constant_nodes(model.graph)
    program = Program(fx.GraphModule(model, graph), [], [])
    for p in (*decompose_passes(), Canonicalize(), FoldConstants(), DeadCodeElimination(),
              FusePatterns(get_family("rms_norm").rules)):
        p(program)
    units = []
    for r in list(graph.nodes):
        if r.target is not rms_norm:
            continue
        x = originals.get(_through(r.args[0], originals))
        root = _original_root(r, originals)
        if x is None or root is None:
            continue
        interior = _between(x, root)
        if interior is None:
            continue
        w = _weight(x, interior, constant) if r.args[1] is not None else None
        units.append(RmsUnit(x, w, root, interior))
    return units


def _weight(x: fx.Node, interior: tuple, constant: set) -> fx.Node | None:
    """The node the unit reads its weight from: the one constant float operand of an
    interior node with the normalised dim's size. Not necessarily a parameter: Gemma's
    ``1 + w`` or a float16 weight's widening, which constant folding turned into the fused
    node's weight."""
    d = x.meta["val"].shape[-1]
    found = {a for n in interior for a in n.all_input_nodes
             if a is not x and a not in interior and a in constant and _is_float(a) and a.meta["val"].numel() == d}
    return found.pop() if len(found) == 1 else None


def _through(v, originals):
    """Walk up from a copy node through casts/reshapes the rewrite added, to a copied node."""
    while isinstance(v, fx.Node) and v not in originals and v.op == "call_function" and (
            v.target in CAST or v.target in IDENTITY or v.target is aten.reshape.default):
        v = v.args[0]
    return v


def _original_root(r: fx.Node, originals) -> fx.Node | None:
    """The original node the fused ``r`` replaced: the argument a copied user of ``r``
    reads at the position where it now reads ``r`` (through a cast the rewrite added)."""
    cur = r
    while True:
        for u in cur.users:
            if u in originals:
                orig = originals[u]
                mine, theirs = u.all_input_nodes, orig.all_input_nodes
                if len(mine) == len(theirs):
                    return theirs[mine.index(cur)]
        nxt = [u for u in cur.users if u.op == "call_function" and u.target in CAST]
        if len(cur.users) != 1 or not nxt:
            return None
        cur = nxt[0]


def _between(x: fx.Node, root: fx.Node) -> tuple[fx.Node, ...] | None:
    """Nodes on a path from ``x`` to ``root`` (``root`` included, ``x`` not), in graph
    order; None if one of them is also read outside the unit."""
    ancestors, stack = {root}, [root]
    while stack:
        for a in stack.pop().all_input_nodes:
            if a is not x and a not in ancestors and a.op == "call_function":
                ancestors.add(a)
                stack.append(a)
    inside, stack = set(), [x]
    while stack:
        for u in stack.pop().users:
            if u in ancestors and u not in inside:
                inside.add(u)
                stack.append(u)
    if root not in inside:
        return None
    for n in inside:
        # a no-op (``x.to(float32)`` of a float32 x) stands for x itself: torch.export lets
        # later reads of x (Llama's residual) go through it, and canonicalization removes it
        if n is not root and not is_noop(n) and any(u not in inside and u.target not in SIDE_EFFECT_ONLY
                                                    for u in n.users):
            return None
    return tuple(n for n in root.graph.nodes if n in inside)


def _zero_pad(x) -> fx.Node | None:
    """``x`` when it is a zero padding (TF-style ``padding="same"``: MobileNetV2) read only by
    the convolution: the exporter folds it into the convolution's own padding, so the
    quantization goes on the pad's input (one uint8 CONV_2D, no float PAD island)."""
    if not (isinstance(x, fx.Node) and x.op == "call_function" and len(x.users) == 1 and _is_float(x.args[0])):
        return None
    if x.target is aten.constant_pad_nd.default:
        value = x.args[2] if len(x.args) > 2 else x.kwargs.get("value", 0)
    elif x.target is aten.pad.default and (x.args[2] if len(x.args) > 2 else x.kwargs.get("mode", "constant")) == "constant":
        value = x.args[3] if len(x.args) > 3 else x.kwargs.get("value", None)
    else:
        return None
    return x if value in (0, 0.0, None) and _ANNOTATION not in x.meta else None


def _fusable_activation(conv: fx.Node) -> fx.Node | None:
    """The ReLU / ReLU6 (``hardtanh(0, 6)``, ``clamp(0, 6)``) that alone reads ``conv``: Circle
    applies it inside the convolution, so the output is quantized after it."""
    users = list(conv.users)
    if len(users) != 1 or users[0].op != "call_function":
        return None
    u = users[0]
    if u.target in RELU:
        return u
    if u.target in CLAMP and \
            list(u.args[1:3]) == [0, 6]:
        return u
    return None


def _constant_nodes(graph: fx.Graph) -> set:
    const = set()
    for n in graph.nodes:
        if n.op == "get_attr" or (n.op == "call_function" and n.all_input_nodes
                                  and all(a in const for a in n.all_input_nodes)):
            const.add(n)
    return const


def _is_float(n) -> bool:
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return isinstance(v, torch.Tensor) and v.is_floating_point()
