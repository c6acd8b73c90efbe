"""Turning an FX node into a human pointer: ``file.py:12 (forward): code``.

``torch.export`` records the Python stack of every op in ``node.meta["stack_trace"]``;
the innermost frame outside torch itself is the line of user (or ``transformers``) code
that produced it, which is what an error message or a fusion report should show.
"""
from __future__ import annotations

import re

import torch.fx as fx

#: a traceback frame; the code line is missing when Python has no source (``<stdin>``, ``exec``)
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)(?:\n(?!\s*File ")\s*(.*))?')


def source_line(node: fx.Node) -> str:
    """The innermost user frame of ``node`` as ``path:line (fn): code``, or ``"<unknown source>"``.

    Model inputs and weights have no stack trace (nothing in ``forward`` computed them):
    they are named instead, as ``model input 'input_ids'`` / ``weight 'lm_head_weight'`` (the
    constant's attribute name: the parameter name with dots replaced)."""
    trace = node.meta.get("stack_trace") if node is not None else None
    if not trace:
        if node is not None and node.op == "placeholder":
            return f"model input {node.name!r}"
        if node is not None and node.op == "get_attr":
            return f"weight {node.target!r}"
        return "<unknown source>"
    frames = _FRAME.findall(trace)
    if not frames:
        return trace.strip().splitlines()[-1]
    # torch's own frames (nn.RMSNorm's F.rms_norm call) say nothing about the model: show the
    # innermost frame outside torch, i.e. the user's `self.norm(x)` line
    outside = [f for f in frames if not _shorten(f[0]).startswith("torch/")]
    path, line, fn, code = (outside or frames)[-1]
    path = _shorten(path)
    return f"{path}:{line} ({fn})" + (f": {code.strip()}" if code.strip() else "")


def _shorten(path: str) -> str:
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def describe(node: fx.Node) -> str:
    """``%name = aten.op`` at ``source`` — a node as it appears in messages."""
    target = node.target if node.op != "call_function" else op_name(node.target)
    return f"%{node.name} = {target} at {source_line(node)}"


def op_name(target) -> str:
    """``aten.mul.Tensor`` style name of a call_function target."""
    name = getattr(target, "_name", None)  # OpOverload: "aten::mul.Tensor"
    if isinstance(name, str) and "::" in name:
        ns, rest = name.split("::", 1)
        overload = getattr(target, "_overloadname", "")
        if overload and not rest.endswith("." + overload):
            rest = f"{rest}.{overload}"
        return f"{ns}.{rest}"
    return getattr(target, "__name__", str(target))
