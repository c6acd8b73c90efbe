"""Where SmoothQuant's ``1/s`` folds exactly: the groups of an RMSNorm-fused graph, each proven
by its structure, and the candidates that were skipped with the named check that refused them.

Three kinds of group (``SmoothGroup.kind`` names where the ``1/s`` goes; the ``linears`` of the
group take ``s`` on their input columns):

- ``"rms_norm"``: a ``circle.rms_norm`` read only by linears (q/k/v, gate/up, lm_head): its
  gamma takes ``1/s``. Found by walking the norm's readers (their number varies).
- ``"up_proj"``: rule ``smooth_gated_mlp``, ``down(mul(a, up(x)))``: ``silu(gate) * up`` is
  linear in ``up``, so ``up``'s output rows (and bias) take ``1/s``.
- ``"v_proj"``: rules ``smooth_attention_*``, ``o_proj(moved(attention(q, k, moved(v_proj(x)))))``
  for SDPA (``enable_gqa`` too), ``matmul`` and ``bmm`` attention: the attention output is
  linear in V along the head dim, so ``v_proj``'s output rows take ``1/s``. The layout between
  ``v_proj``, the attention and ``o_proj`` (head split, transposes, HF's ``repeat_kv``, the
  head merge) is not trusted from names or shapes: check ``channel_map`` pushes a tensor of
  channel *labels* (``arange`` over ``v_proj``'s outputs) through the very data-movement ops of
  the match and through the attention (which must mix positions only, i.e. the labels be
  constant along V's position axis), and accepts only when every ``o_proj`` input column reads
  one ``v_proj`` channel at every position. With GQA several q heads read one kv head, so
  several ``o_proj`` columns share a channel, and ``s`` is per ``v_proj`` channel
  (:func:`circle_fx.quant.smooth.smoothing_scales` reduces over the columns that read it).

Every matched interior node is read inside the match only (the pattern language's rule), and
checks ``weights_constant`` / ``weights_private`` refuse weights that are not constants or are
also read elsewhere (a tied ``lm_head``): scaling them would change another reader.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx as fx

from ..fusions.rms_norm import rms_norm
from ..fx_utils import arguments, is_noop, look_through
from ..op_traits import MOVEMENT, RESHAPE
from ..patterns import Pattern, Rewrite, moved, try_rewrite
from ..program import fetch_attr
from ..source import describe, source_line

aten = torch.ops.aten
ATTENTION_OPS = {aten.scaled_dot_product_attention.default: 2, aten.matmul.default: 1, aten.bmm.default: 1}

#: the pipeline pass after which the groups can be found: SmoothQuant reads the RMSNorm-fused
#: graph (``explain`` inserts its look right after it, so it names no family itself)
SEES_GRAPH_AFTER = "fuse_rms_norm"


@dataclass
class SmoothGroup:
    """One smoothable value: ``source`` (the value whose channels are calibrated: the norm,
    the gated ``mul``, ``o_proj``'s input) feeds ``linears``, whose input columns take ``s``;
    ``kind`` is ``"rms_norm"``, ``"up_proj"`` or ``"v_proj"`` (where the ``1/s`` goes)."""

    kind: str
    source: fx.Node
    linears: list[fx.Node]
    #: the linear whose output rows take ``1/s`` (kinds ``"up_proj"``, ``"v_proj"``)
    up: fx.Node | None = None
    #: ``v_proj``: the ``v_proj`` channel each ``o_proj`` input column reads (None: the identity)
    channels: torch.Tensor | None = None
    scale: torch.Tensor | None = field(default=None)

    @property
    def width(self) -> int:
        """How many scales the group takes (``v_proj``: its output channels)."""
        if self.up is not None:
            return self.up.meta["val"].shape[-1]
        return self.source.meta["val"].shape[-1]


@dataclass
class Skipped:
    """A candidate whose scale would not fold exactly: the rule and check that refused it."""

    kind: str
    node: str
    source: str
    rule: str
    reason: str
    check: str | None = None

    def format(self) -> str:
        lines = [f"{self.kind} candidate {self.node}", f"    source: {self.source}",
                 f"    why:    {self.reason}  [rule {self.rule}]"]
        if self.check:
            lines.append(f"    check:  {self.check}")
        return "\n".join(lines)


def _const(gm, v):
    return fetch_attr(gm, v.target) if isinstance(v, fx.Node) and v.op == "get_attr" else None


def _attr_readers(gm) -> dict:
    """id of each constant tensor -> the get_attr nodes' users reading it (tied weights share one)."""
    readers: dict[int, list] = {}
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            t = fetch_attr(gm, n.target)
            if isinstance(t, torch.Tensor):
                readers.setdefault(id(t), []).extend(n.users)
    return readers


def _weight_problem(gm, w, b=None) -> str | None:
    wt = _const(gm, w)
    if wt is None or wt.dim() != 2 or not wt.is_floating_point():
        return f"the weight {_name(w)} is not a constant 2-D float tensor"
    if b is not None and _const(gm, b) is None:
        return f"the bias {_name(b)} is not a constant"
    return None


def _private_problem(gm, readers, consts, users) -> str | None:
    for c in consts:
        if c is None:
            continue
        other = [u for u in readers.get(id(fetch_attr(gm, c.target)), ()) if u not in users]
        if other:
            return f"{_name(c)} is also read by {describe(other[0])}: scaling it would change that reader"
    return None


def _name(v) -> str:
    return f"'{v.target}'" if isinstance(v, fx.Node) and v.op == "get_attr" else (
        f"%{v.name}" if isinstance(v, fx.Node) else repr(v))


# ------------------------------------------------------------------ gated MLP and attention rules

def gated_mlp(a, x, w_up, b_up, w_down, b_down):
    return aten.linear.default(aten.mul.Tensor(a, aten.linear.default(x, w_up, b_up)), w_down, b_down)


def attention_sdpa(q, k, x, w_v, b_v, mask, dropout, causal, scale, gqa, w_o, b_o):
    v = moved(aten.linear.default(x, w_v, b_v))
    att = aten.scaled_dot_product_attention.default(q, k, v, mask, dropout, causal, scale=scale, enable_gqa=gqa)
    return aten.linear.default(moved(att), w_o, b_o)


def attention_matmul(p, x, w_v, b_v, w_o, b_o):
    return aten.linear.default(moved(aten.matmul.default(p, moved(aten.linear.default(x, w_v, b_v)))), w_o, b_o)


def attention_bmm(p, x, w_v, b_v, w_o, b_o):
    return aten.linear.default(moved(aten.bmm.default(p, moved(aten.linear.default(x, w_v, b_v)))), w_o, b_o)


def _up(m) -> fx.Node:
    """The matched linear whose rows take ``1/s`` (``up_proj`` / ``v_proj``)."""
    return next(n for n in m.nodes if n is not m.root and n.target is aten.linear.default
                and n.args[1] is look_through(m["w_" + ("up" if "w_up" in m.bindings else "v")]))


def _reads(n, source: fx.Node, before: fx.Node) -> bool:
    """Does ``n`` (a node or a constant) depend on ``source``? Walks ``source``'s users forward,
    in graph order up to ``before`` only (the walk stays local: a few view ops)."""
    if not isinstance(n, fx.Node):
        return False
    order = {x: i for i, x in enumerate(before.graph.nodes)}
    stop, seen, todo = order[before], {source}, [source]
    while todo:
        for u in todo.pop().users:
            if u not in seen and order[u] < stop:
                seen.add(u)
                todo.append(u)
    return n in seen


def gate_not_up(m):
    """The multiplier must not depend on ``up``: ``silu(up) * up`` (or ``up * up``) is not linear
    in ``up``, so ``up``'s rows cannot take ``1/s``."""
    if _reads(m["a"], _up(m), m.root):
        return "the mul's other factor depends on up_proj (e.g. mul(up, up)): not linear in up"
    return None


def value_path_only(m):
    """Only V may depend on ``v_proj``: when the query, key, attention weights or mask read it too
    (``sdpa(h, h, h)``), scaling ``v_proj``'s rows changes the attention weights as well."""
    u = _up(m)
    for name in ("q", "k", "p", "mask"):
        if name in m.bindings and _reads(m[name], u, m.root):
            return f"the attention's {name} depends on v_proj ({describe(u)}): not linear in V alone"
    return None


def weights_constant(m):
    up = "up" if "w_up" in m.bindings else "v"
    down = "down" if "w_down" in m.bindings else "o"
    gm = m.root.graph.owning_module
    return _weight_problem(gm, m["w_" + up], m["b_" + up]) or _weight_problem(gm, m["w_" + down])


def weights_private(m):
    up = "up" if "w_up" in m.bindings else "v"
    gm = m.root.graph.owning_module
    u = _up(m)
    return (_private_problem(gm, _attr_readers(gm), [m["w_" + up], m["b_" + up]], [u])
            or _private_problem(gm, _attr_readers(gm), [m["w_" + ("down" if "w_down" in m.bindings else "o")]],
                                [m.root]))


def channel_map(m):
    return _channel_map(m)[1]


def _labels_through(n: fx.Node, labels: dict):
    """The labels of ``n``'s output from its data input's, or a reason."""
    if n.target in ATTENTION_OPS:
        src = arguments(n)[ATTENTION_OPS[n.target]]
    else:
        src = n.args[0]
    if src not in labels:
        return f"{describe(n)} does not take the V path as its {'value' if n.target in ATTENTION_OPS else 'input'}"
    lab = labels[src]
    if is_noop(n):
        return lab
    if "val" not in n.meta or (n.target not in ATTENTION_OPS
                               and any(isinstance(a, fx.Node) for a in (*n.args[1:], *n.kwargs.values()))):
        return f"{describe(n)} has a dynamic shape"
    out_shape = tuple(n.meta["val"].shape)
    if not all(isinstance(d, int) for d in out_shape):
        return f"{describe(n)} has a dynamic shape {list(out_shape)}"
    if n.target in ATTENTION_OPS:
        if lab.dim() < 2:
            return f"{describe(n)}: V is {lab.dim()}-D"
        if n.target is aten.scaled_dot_product_attention.default and lab.dim() >= 3 and out_shape[-3] != lab.shape[-3]:
            if out_shape[-3] % lab.shape[-3]:
                return f"{describe(n)}: {out_shape[-3]} query heads do not group over {lab.shape[-3]} V heads"
            lab = lab.repeat_interleave(out_shape[-3] // lab.shape[-3], dim=-3)
        if not bool((lab == lab[..., :1, :]).all()):
            return f"{describe(n)}: V's channels differ along its position axis, so the attention mixes them"
        try:
            return torch.broadcast_to(lab[..., :1, :], out_shape)
        except RuntimeError:
            return f"{describe(n)}: V does not broadcast to the output {list(out_shape)}"
    target = aten.reshape.default if n.target in RESHAPE else n.target
    return target(lab, *n.args[1:], **n.kwargs)


def _channel_map(m) -> tuple[torch.Tensor | None, str | None]:
    """``(channels, None)``: the ``v_proj`` channel each ``o_proj`` input column reads, proven
    by pushing channel labels through the matched ops (module docstring); else ``(None, why)``."""
    v = _up(m)
    if "val" not in v.meta:
        return None, f"{describe(v)} has no shape"
    shape = tuple(v.meta["val"].shape)
    if not all(isinstance(d, int) for d in shape):
        return None, f"{describe(v)} has a dynamic shape {list(shape)}"
    labels = {v: torch.arange(shape[-1]).expand(shape)}
    order = {n: i for i, n in enumerate(m.root.graph.nodes)}
    for n in sorted(m.nodes, key=order.__getitem__):
        if n is v or n is m.root:
            continue
        if not (n.target in ATTENTION_OPS or n.target in MOVEMENT or is_noop(n)):
            return None, f"{describe(n)} is not data movement or the attention"
        out = _labels_through(n, labels)
        if isinstance(out, str):
            return None, out
        labels[n] = out
    src = m.root.args[0]
    if src not in labels:
        return None, "o_proj does not read the attention output"
    flat = labels[src].reshape(-1, labels[src].shape[-1])
    if not bool((flat == flat[:1]).all()):
        return None, "an o_proj input column reads different V channels at different positions"
    return flat[0].clone(), None


def _not_a_rewrite(m, graph):
    raise NotImplementedError("a SmoothQuant rule rescales constants; it replaces no node")


_CHECKS = (weights_constant, weights_private)
MLP_RULES = [Rewrite("smooth_gated_mlp", Pattern(gated_mlp), _not_a_rewrite, (gate_not_up, *_CHECKS), "up_proj")]
ATTENTION_RULES = [Rewrite(f"smooth_{p.__name__}", Pattern(p), _not_a_rewrite, (*_CHECKS, value_path_only, channel_map),
                           "v_proj")
                   for p in (attention_sdpa, attention_matmul, attention_bmm)]


# ------------------------------------------------------------------ RMSNorm groups

def _norm_group(gm, readers, n: fx.Node) -> SmoothGroup | Skipped:
    users = list(n.users)

    def skip(check, reason):
        return Skipped("rms_norm", describe(n).split(" at ", 1)[0], source_line(n), "smooth_rms_norm", reason, check)

    for u in users:
        if not (u.op == "call_function" and u.target is aten.linear.default and u.args[0] is n):
            return skip("readers_are_linears", f"{describe(u)} reads the norm and is not a linear of it: "
                                               "it would see the norm divided by s")
    for u in users:
        why = _weight_problem(gm, u.args[1], u.args[2] if len(u.args) > 2 else None)
        if why:
            return skip("weights_constant", why)
    why = _private_problem(gm, readers, [u.args[1] for u in users], users)
    if why:
        return skip("weights_private", why)
    if len({fetch_attr(gm, u.args[1].target).shape[1] for u in users}) != 1:
        return skip("one_width", "the linears read different widths")
    g = n.args[1]
    if g is not None:
        gt = _const(gm, g)
        if gt is None or gt.shape != (n.meta["val"].shape[-1],):
            return skip("gamma_constant", f"the gamma {_name(g)} is not a constant per-channel vector")
        why = _private_problem(gm, readers, [g], [n])
        if why:
            return skip("gamma_private", why)
    return SmoothGroup("rms_norm", n, users)


# ------------------------------------------------------------------ the sweep

def _candidate_kind(n: fx.Node) -> str | None:
    """What ``n`` is a candidate for: a norm read by a linear, a linear reading a product with
    a linear factor (``down_proj``) or an attention output (``o_proj``)."""
    if n.op != "call_function":
        return None
    if n.target is rms_norm:
        return "rms_norm" if any(u.target is aten.linear.default and u.args[0] is n for u in n.users) else None
    if n.target is not aten.linear.default:
        return None
    x = look_through(n.args[0])
    if isinstance(x, fx.Node) and x.target is aten.mul.Tensor and any(
            isinstance(a, fx.Node) and look_through(a).target is aten.linear.default for a in x.args):
        return "up_proj"
    while isinstance(x, fx.Node) and x.op == "call_function" and x.target in MOVEMENT:
        x = look_through(x.args[0])
    return "v_proj" if isinstance(x, fx.Node) and x.target in ATTENTION_OPS else None


def _by_rules(rules, n: fx.Node, kind: str) -> SmoothGroup | Skipped:
    best = None
    for rule in rules:
        m = try_rewrite(rule, n)
        if m:
            up = _up(m)
            if kind == "up_proj":
                return SmoothGroup(kind, look_through(n.args[0]), [n], up)
            return SmoothGroup(kind, n.args[0], [n], up, _channel_map(m)[0])
        key = (m.check is not None, m.progress)
        if best is None or key > best[0]:
            best = (key, rule.name, m)
    _, rule, f = best
    return Skipped(kind, describe(n).split(" at ", 1)[0], source_line(n), rule, f.reason, f.check)


def smooth_candidates(gm: fx.GraphModule, kinds=("rms_norm", "up_proj", "v_proj")):
    """``(groups, skipped)`` of a fused graph: the groups whose scale folds exactly, in graph
    order, and the candidates of ``kinds`` refused (with the check that said no)."""
    readers = _attr_readers(gm)
    groups, skipped = [], []
    for n in gm.graph.nodes:
        kind = _candidate_kind(n)
        if kind not in kinds:
            continue
        if kind == "rms_norm":
            got = _norm_group(gm, readers, n)
        else:
            got = _by_rules(MLP_RULES if kind == "up_proj" else ATTENTION_RULES, n, kind)
        (groups if isinstance(got, SmoothGroup) else skipped).append(got)
    return groups, skipped

