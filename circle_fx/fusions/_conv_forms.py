"""The forms a convolution takes where the convolution fusion families (``conv_batch_norm``,
``fused_activation``) match it, and the rebuilding of that form around a replacement.

The NHWC decompositions leave a 2-D convolution as ``permute(circle.conv2d_nhwc(...))`` and a
1-D one as ``permute(squeeze(circle.conv2d_nhwc(...), 1))``; after the layout pass the permute
has moved past the op a family fuses, which then reads ``circle.conv2d_nhwc`` directly. Both
families match all three forms (before the layout pass for the pipeline, after it for
``explain``, which looks at the final graph), so the pattern pieces, the lookup of the matched
convolution, its "no activation yet" check and the rebuilding live here once.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..fx_utils import make_node
from ..dialect.nhwc import conv2d_nhwc

aten = torch.ops.aten


def conv(x, w, b, stride, pads, dilation, groups):
    """Pattern piece: the channels-last convolution (no activation argument: ``none``)."""
    return conv2d_nhwc(x, w, b, stride, pads, dilation, groups)


def nchw(x, w, b, stride, pads, dilation, groups, perm):
    """Pattern piece: a 2-D convolution permuted back to NCHW."""
    return aten.permute.default(conv(x, w, b, stride, pads, dilation, groups), perm)


def ncl(x, w, b, stride, pads, dilation, groups, perm):
    """Pattern piece: a 1-D convolution (a 2-D one over H = 1) squeezed and permuted to NCL."""
    return aten.permute.default(aten.squeeze.dim(conv(x, w, b, stride, pads, dilation, groups), 1), perm)


def conv_node(m) -> fx.Node:
    """The matched ``circle.conv2d_nhwc`` node."""
    return next(n for n in m.nodes if n.target is conv2d_nhwc)


def check_no_activation(m):
    """Named check: the convolution applies no fused activation yet (a second one cannot be
    added, and scaling after an activation is not scaling the convolution)."""
    c = conv_node(m)
    act = c.args[7] if len(c.args) > 7 else c.kwargs.get("activation", "none")
    return None if act == "none" else f"the convolution already applies {act}"


def rewrap(m, g: fx.Graph, new: fx.Node) -> fx.Node:
    """``new`` (the replacing convolution) put back into the matched form: the squeeze of a
    1-D convolution and the permute to NCHW / NCL, if matched. Each node keeps the value
    (shape, dtype) of the node it stands for: re-inferring would turn constant dims symbolic."""
    new.meta["val"] = conv_node(m).meta["val"]
    squeeze = next((n for n in m.nodes if n.target is aten.squeeze.dim), None)
    if squeeze is not None:
        new = make_node(g, aten.squeeze.dim, (new, 1), like=m.root)
        new.meta["val"] = squeeze.meta["val"]
    if "perm" in m.bindings:
        new = make_node(g, aten.permute.default, (new, m["perm"]), like=m.root)
        new.meta["val"] = m.root.meta["val"]
    return new


def conv_read_by(n: fx.Node, targets) -> bool:
    """``explain`` candidate: ``n`` is a convolution (or its squeeze / permute back to NCHW / NCL)
    that an op of ``targets`` reads."""
    src = n.args[0] if n.target in (aten.permute.default, aten.squeeze.dim) and n.args else n
    if isinstance(src, fx.Node) and src.target is aten.squeeze.dim:
        src = src.args[0]
    return (isinstance(src, fx.Node) and src.target is conv2d_nhwc
            and any(u.target in targets for u in n.users))
