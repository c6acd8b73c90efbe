"""SmoothQuant as a compile-time pass: per-channel activation outliers moved into the weights.

A trained LLM's linear inputs carry a few huge channels, so one uint8 per-tensor scale wastes
most of its steps on them. SmoothQuant (Xiao et al. 2023) divides input channel ``j`` by
``s_j`` and multiplies column ``j`` of every weight that reads it by ``s_j``: the product is
unchanged, the activation range shrinks, the weight range grows a little.
``s_j = max|X_j| ** alpha / max|W_j| ** (1 - alpha)`` (``max|W_j|`` over every linear of the
group), ``max|X_j|`` calibrated on the user's data.

The ``1/s`` costs nothing only where it folds into a constant that already exists:

- **RMSNorm -> linears** (q/k/v after ``input_layernorm``, gate/up after
  ``post_attention_layernorm``, lm_head after the final norm): ``gamma / s``. This runs on the
  *fused* graph, where every spelling the RMSNorm family accepts (Gemma's ``1 + w`` included)
  is one ``circle.rms_norm(x, gamma, eps)`` whose gamma is a folded constant; an unweighted
  norm gets ``1/s`` as its gamma.
- **``mul(a, up) -> down_proj``** (the gated MLP, ``up`` a linear read by nothing else):
  ``up``'s output rows (weight rows and bias) divided by ``s``.

Anything else (e.g. ``o_proj`` after attention over ``v``) is left alone: not done yet.
A group is smoothed only when every reader of the scaled value is a linear of the group and
every scaled weight is read by that linear alone (a tied ``lm_head`` is skipped).

:func:`smooth_quant` takes a ``torch.export``-ed module, fuses its RMSNorms in place (the
quantizer then sees ``circle.rms_norm`` units), calibrates and rescales constants: no op is
added. ``CircleQuantizer(smooth_quant=alpha, calibration=...)`` runs it before annotation.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx as fx

from ..errors import InputError
from ..fusions.rms_norm import rms_norm
from ..program import Program, fetch_attr

aten = torch.ops.aten


@dataclass
class SmoothGroup:
    """One smoothable value: ``source`` (a ``circle.rms_norm`` or the gated ``mul``) feeds
    ``linears``; ``kind`` is ``"rms_norm"`` or ``"up_proj"`` (where the ``1/s`` goes)."""

    kind: str
    source: fx.Node
    linears: list[fx.Node]
    #: the linear whose output rows take ``1/s`` (kind ``"up_proj"``)
    up: fx.Node | None = None
    scale: torch.Tensor | None = field(default=None)


def fuse_rms_norms(gm: fx.GraphModule) -> Program:
    """Fuse ``gm``'s RMSNorms in place (decompose, canonicalize, fold constants, DCE, the
    RMSNorm family: what the float exporter does first), leaving every other op as it is."""
    from ..fusions import get_family
    from ..passes import Canonicalize, DeadCodeElimination, DecomposeComposites, FoldConstants, FusePatterns

    program = Program(gm, [], [])
    for p in (DecomposeComposites(), Canonicalize(), FoldConstants(), DeadCodeElimination(),
              FusePatterns(get_family("rms_norm").rules)):
        p(program)
    gm.recompile()
    return program


def _const(gm, v) -> torch.Tensor | None:
    return fetch_attr(gm, v.target) if isinstance(v, fx.Node) and v.op == "get_attr" else None


def _linear_parts(gm, n: fx.Node, x: fx.Node):
    """``(weight node, bias node or None)`` when ``n`` is ``linear(x, W[, b])`` with constant
    W (and b), else None."""
    if n.op != "call_function" or n.target is not aten.linear.default or n.args[0] is not x or n.kwargs:
        return None
    w = n.args[1]
    b = n.args[2] if len(n.args) > 2 else None
    wt = _const(gm, w)
    if wt is None or wt.dim() != 2 or not wt.is_floating_point() or (b is not None and _const(gm, b) is None):
        return None
    return w, b


def _attr_readers(gm) -> dict:
    """id of each constant tensor -> the get_attr nodes' users reading it (tied weights share one)."""
    readers: dict[int, list] = {}
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            t = fetch_attr(gm, n.target)
            if isinstance(t, torch.Tensor):
                readers.setdefault(id(t), []).extend(n.users)
    return readers


def _only_read_by(gm, readers, w: fx.Node, users) -> bool:
    return all(u in users for u in readers.get(id(fetch_attr(gm, w.target)), ()))


def smooth_groups(gm: fx.GraphModule) -> list[SmoothGroup]:
    """The groups of a fused graph whose scale folds exactly (module docstring)."""
    readers = _attr_readers(gm)
    groups = []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        users = list(n.users)
        if not users:
            continue
        parts = [_linear_parts(gm, u, n) for u in users]
        if any(p is None for p in parts):
            continue
        if not all(_only_read_by(gm, readers, w, users) for w, _ in parts):
            continue
        d = {fetch_attr(gm, w.target).shape[1] for w, _ in parts}
        if len(d) != 1:
            continue
        if n.target is rms_norm:
            g = n.args[1]
            if g is not None and (_const(gm, g) is None or _const(gm, g).shape != (d.pop(),)
                                  or not _only_read_by(gm, readers, g, [n])):
                continue
            groups.append(SmoothGroup("rms_norm", n, users))
        elif n.target is aten.mul.Tensor and len(n.args) == 2:
            up = _up_proj(gm, readers, n)
            if up is not None:
                groups.append(SmoothGroup("up_proj", n, users, up))
    return groups


def _up_proj(gm, readers, mul: fx.Node) -> fx.Node | None:
    """The factor of ``mul`` that is a linear with constant weight read only by ``mul``,
    whose other factor does not depend on it (then scaling its rows scales ``mul``)."""
    a, b = mul.args
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)) or a.meta.get("val") is None \
            or b.meta.get("val") is None or a.meta["val"].shape != b.meta["val"].shape:
        return None
    for up, other in ((b, a), (a, b)):
        if up is other or list(up.users) != [mul] or up.op != "call_function" or up.target is not aten.linear.default:
            continue
        parts = _linear_parts(gm, up, up.args[0])
        if parts is None or not all(_only_read_by(gm, readers, p, [up]) for p in parts if p is not None):
            continue
        if up not in _ancestors(other):
            return up
    return None


def _ancestors(n: fx.Node) -> set:
    seen, stack = set(), [n]
    while stack:
        for a in stack.pop().all_input_nodes:
            if a not in seen:
                seen.add(a)
                stack.append(a)
    return seen


def calibrate_maxima(gm: fx.GraphModule, sources: list[fx.Node], calibration) -> dict:
    """Per-channel ``max |x|`` (over every position of every calibration batch) of each node
    in ``sources``, by interpreting the graph."""
    wanted = set(sources)
    maxima: dict[fx.Node, torch.Tensor] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if n in wanted:
                m = out.detach().abs().reshape(-1, out.shape[-1]).amax(0).float()
                maxima[n] = m if n not in maxima else torch.maximum(maxima[n], m)
            return out

    with torch.no_grad():
        for batch in calibration:
            Recorder(gm).run(*(batch if isinstance(batch, (tuple, list)) else (batch,)))
    return maxima


def smoothing_scales(x_max: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    """``s_j = max|X_j| ** alpha / max|W_j| ** (1 - alpha)``, channels never seen (or with zero
    weights) left at 1."""
    w_max = torch.stack([w.detach().abs().amax(0).float() for w in weights]).amax(0)
    s = x_max.clamp(min=1e-5).pow(alpha) / w_max.clamp(min=1e-5).pow(1 - alpha)
    ok = (x_max > 0) & (w_max > 0) & torch.isfinite(s)
    return torch.where(ok, s, torch.ones_like(s)).clamp(1e-4, 1e4)


def apply_scales(gm: fx.GraphModule, group: SmoothGroup, s: torch.Tensor) -> None:
    """Fold ``s`` into the constants: the source's output / ``s``, the linears' columns * ``s``.
    New tensors are set (never written in place: they may share storage with the user's model)."""
    for lin in group.linears:
        _scale_attr(gm, lin.args[1], lambda w: w * s.to(w.dtype))
    if group.kind == "rms_norm":
        g = group.source.args[1]
        if g is None:
            name = _fresh_attr(gm, "_smooth_gamma")
            gm.register_buffer(name, (1.0 / s).to(group.source.meta["val"].dtype))
            with gm.graph.inserting_before(group.source):
                gamma = gm.graph.get_attr(name)
            gamma.meta["val"] = getattr(gm, name)
            group.source.args = (group.source.args[0], gamma, *group.source.args[2:])
        else:
            _scale_attr(gm, g, lambda w: w / s.to(w.dtype))
    else:
        up = group.up
        _scale_attr(gm, up.args[1], lambda w: w / s.to(w.dtype)[:, None])
        if len(up.args) > 2 and up.args[2] is not None:
            _scale_attr(gm, up.args[2], lambda b: b / s.to(b.dtype))
    group.scale = s


def _scale_attr(gm, node: fx.Node, fn) -> None:
    owner_path, _, leaf = node.target.rpartition(".")
    owner = gm.get_submodule(owner_path) if owner_path else gm
    old = getattr(owner, leaf)
    with torch.no_grad():
        new = fn(old.detach())
    if isinstance(old, torch.nn.Parameter):
        new = torch.nn.Parameter(new, requires_grad=False)
    if leaf in getattr(owner, "_buffers", {}):
        owner._buffers[leaf] = new
    elif leaf in getattr(owner, "_parameters", {}):
        owner._parameters[leaf] = new
    else:
        setattr(owner, leaf, new)


def _fresh_attr(gm, base: str) -> str:
    i = 0
    while hasattr(gm, f"{base}_{i}"):
        i += 1
    return f"{base}_{i}"


def smooth_quant(gm: fx.GraphModule, calibration, alpha: float = 0.5) -> list[SmoothGroup]:
    """Fuse ``gm``'s RMSNorms, calibrate the inputs of every smoothable linear group on
    ``calibration`` (an iterable of input tuples), fold the SmoothQuant scales into the
    constants. ``gm`` is rewritten in place and computes what it computed (up to float
    rounding). Returns the groups smoothed (each with its ``scale``)."""
    if not 0.0 <= float(alpha) <= 1.0:
        raise InputError(f"smooth_quant(alpha={alpha!r}): expected a number in [0, 1]")
    calibration = list(calibration)
    if not calibration:
        raise InputError("smooth_quant needs calibration data (an iterable of input tuples); got none")
    fuse_rms_norms(gm)
    groups = smooth_groups(gm)
    maxima = calibrate_maxima(gm, [g.source for g in groups], calibration)
    for g in groups:
        weights = [fetch_attr(gm, lin.args[1].target) for lin in g.linears]
        apply_scales(gm, g, smoothing_scales(maxima[g.source], weights, float(alpha)))
    gm.recompile()
    return groups
