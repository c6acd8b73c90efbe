"""SmoothQuant as a compile-time pass: per-channel activation outliers moved into the weights.

A trained LLM's linear inputs carry a few huge channels, so one uint8 per-tensor scale wastes
most of its steps on them. SmoothQuant (Xiao et al. 2023) divides input channel ``j`` by
``s_j`` and multiplies column ``j`` of every weight that reads it by ``s_j``: the product is
unchanged, the activation range shrinks, the weight range grows a little.
``s_j = max|X_j| ** alpha / max|W_j| ** (1 - alpha)`` (``max|W_j|`` over every linear of the
group), ``max|X_j|`` calibrated on the user's data.

The ``1/s`` costs nothing only where it folds into a constant that already exists
(:mod:`circle_fx.quant.smooth_rules` finds these groups and proves each by its structure):

- **RMSNorm -> linears** (q/k/v after ``input_layernorm``, gate/up after
  ``post_attention_layernorm``, lm_head after the final norm): ``gamma / s``. This runs on the
  *fused* graph, where every spelling the RMSNorm family accepts (Gemma's ``1 + w`` included)
  is one ``circle.rms_norm(x, gamma, eps)`` whose gamma is a folded constant; an unweighted
  norm gets ``1/s`` as its gamma.
- **up_proj -> down_proj** (the gated MLP, ``down(silu(gate) * up)``): ``up``'s output rows
  (weight rows and bias) divided by ``s``.
- **v_proj -> o_proj** (attention is linear in V): ``v_proj``'s output rows divided by ``s``,
  one scale per ``v_proj`` channel; with GQA every ``o_proj`` column that reads a channel (one
  per query head of its group) takes that channel's ``s``.

A group is smoothed only when every reader of the scaled value is a linear of the group and
every scaled weight is read by that linear alone (a tied ``lm_head`` is skipped); the skipped
candidates, with the check that refused them, are listed by ``circle_fx.explain``.

:func:`smooth_quant` takes a ``torch.export``-ed module, fuses its RMSNorms in place (the
quantizer then sees ``circle.rms_norm`` units), calibrates and rescales constants: no op is
added. ``CircleQuantizer(smooth_quant=alpha, calibration=...)`` runs it before annotation.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..errors import InputError
from ..program import Program, fetch_attr
from .smooth_rules import SmoothGroup, Skipped, smooth_candidates

#: every kind of group (where the ``1/s`` goes); ``smooth_quant(kinds=...)`` picks some
KINDS = ("rms_norm", "up_proj", "v_proj")
__all__ = ["KINDS", "SmoothGroup", "Skipped", "smooth_quant", "smooth_groups", "smooth_candidates"]


def fuse_rms_norms(gm: fx.GraphModule) -> Program:
    """Fuse ``gm``'s RMSNorms in place (decompose, canonicalize, fold constants, DCE, the
    RMSNorm family: what the float exporter does first), leaving every other op as it is."""
    from ..fusions import get_family
    from ..passes import Canonicalize, DeadCodeElimination, FoldConstants, decompose_passes, FusePatterns

    program = Program(gm, [], [])
    for p in (*decompose_passes(), Canonicalize(), FoldConstants(), DeadCodeElimination(),
              FusePatterns(get_family("rms_norm").rules)):
        p(program)
    gm.recompile()
    return program


def smooth_groups(gm: fx.GraphModule, kinds=KINDS) -> list[SmoothGroup]:
    """The groups of a fused graph whose scale folds exactly (module docstring), of ``kinds``."""
    return smooth_candidates(gm, kinds)[0]


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


def smoothing_scales(x_max: torch.Tensor, weights: list[torch.Tensor], alpha: float,
                     channels: torch.Tensor | None = None, width: int | None = None) -> torch.Tensor:
    """``s_j = max|X_j| ** alpha / max|W_j| ** (1 - alpha)``, channels never seen (or with zero
    weights) left at 1. ``channels`` (``v_proj`` groups): input column -> the scaled channel
    it reads, ``width`` of them; both maxima are taken over the columns reading a channel."""
    w_max = torch.stack([w.detach().abs().amax(0).float() for w in weights]).amax(0)
    if channels is not None:
        x_max = torch.zeros(width).scatter_reduce(0, channels, x_max, "amax")
        w_max = torch.zeros(width).scatter_reduce(0, channels, w_max, "amax")
    s = x_max.clamp(min=1e-5).pow(alpha) / w_max.clamp(min=1e-5).pow(1 - alpha)
    ok = (x_max > 0) & (w_max > 0) & torch.isfinite(s)
    return torch.where(ok, s, torch.ones_like(s)).clamp(1e-4, 1e4)


def apply_scales(gm: fx.GraphModule, group: SmoothGroup, s: torch.Tensor) -> None:
    """Fold ``s`` (``group.width`` scales) into the constants: the source's output / ``s``, the
    linears' columns * ``s`` (``s[channels]`` for a ``v_proj`` group). New tensors are set (never
    written in place: they may share storage with the user's model)."""
    cols = s if group.channels is None else s[group.channels]
    for lin in group.linears:
        replace_attr(gm, lin.args[1], lambda w: w * cols.to(w.dtype))
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
            replace_attr(gm, g, lambda w: w / s.to(w.dtype))
    else:
        up = group.up
        replace_attr(gm, up.args[1], lambda w: w / s.to(w.dtype)[:, None])
        if len(up.args) > 2 and up.args[2] is not None:
            replace_attr(gm, up.args[2], lambda b: b / s.to(b.dtype))
    group.scale = s


def replace_attr(gm, node: fx.Node, fn) -> None:
    """Set the attribute ``get_attr`` node ``node`` reads to ``fn(old value)``, as a new tensor
    of the same kind (parameter, buffer or plain attribute): the old storage, which may be the
    user's model's, is never written."""
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


def smooth_quant(gm: fx.GraphModule, calibration, alpha: float = 0.5, kinds=KINDS) -> list[SmoothGroup]:
    """Fuse ``gm``'s RMSNorms, calibrate the inputs of every smoothable linear group of
    ``kinds`` on ``calibration`` (an iterable of input tuples), fold the SmoothQuant scales
    into the constants. ``gm`` is rewritten in place and computes what it computed (up to
    float rounding). Returns the groups smoothed (each with its ``scale``)."""
    if not 0.0 <= float(alpha) <= 1.0:
        raise InputError(f"smooth_quant(alpha={alpha!r}): expected a number in [0, 1]")
    calibration = list(calibration)
    if not calibration:
        raise InputError("smooth_quant needs calibration data (an iterable of input tuples); got none")
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    if not set(kinds) <= set(KINDS):
        raise InputError(f"smooth_quant(kinds={kinds!r}): expected some of {', '.join(map(repr, KINDS))}")
    fuse_rms_norms(gm)
    groups = smooth_groups(gm, kinds)
    maxima = calibrate_maxima(gm, [g.source for g in groups], calibration)
    for g in groups:
        weights = [fetch_attr(gm, lin.args[1].target) for lin in g.linears]
        apply_scales(gm, g, smoothing_scales(maxima[g.source], weights, float(alpha), g.channels, g.width))
    gm.recompile()
    return groups
