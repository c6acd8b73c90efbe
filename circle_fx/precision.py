"""Half-precision models: refused by default, or exported in float32 on request.

Circle can *describe* a FLOAT16 tensor, and such a file passes ``verify``; but onert 0.1.0
rejects every FLOAT16 tensor when it prepares the session ("Model has type that runtime
API does not support"), and Circle has no bfloat16 at all. A file that verifies and then
cannot run is the worst outcome, so :func:`check_precision` refuses the graph up front,
naming the tensors and the two remedies.

``export(..., cast_to_float32=True)`` is the explicit opt-in: :func:`float32_for_export`
casts the model's half-precision parameters and buffers (and the example inputs) to
float32 for the duration of the capture and puts the original tensor objects back
afterwards (the user's model is not changed; parameters keep their identity).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from .errors import UnsupportedDtypeError
from .source import source_line

HALF = (torch.float16, torch.bfloat16)


def check_precision(program) -> None:
    """Raise :class:`UnsupportedDtypeError` if any tensor in the graph is float16/bfloat16."""
    found: list[str] = []
    for n in program.gm.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor) and v.dtype in HALF:
            # the same line format as the emitter's other unsupported-dtype errors
            where = ("model input" if n.op == "placeholder" else
                     f"constant {n.target!r}" if n.op == "get_attr" else f"at {source_line(n)}")
            found.append(f"  %{n.name}: {v.dtype} {where}")
    if found:
        raise UnsupportedDtypeError(
            f"{len(found)} half-precision tensor(s); onert 0.1.0 loads no FLOAT16 tensor (the file would "
            "verify but fail to run) and Circle has no bfloat16. Export with cast_to_float32=True "
            "(casts weights and inputs to float32 for the export only), or call model.float() first:\n"
            + "\n".join(found[:10]) + (f"\n  ... and {len(found) - 10} more" if len(found) > 10 else ""))


def _cast(value):
    if isinstance(value, torch.Tensor) and value.dtype in HALF:
        return value.float()
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v) for k, v in value.items()}
    return value


@contextmanager
def float32_for_export(model: torch.nn.Module, args: tuple, kwargs: dict,
                       enabled: bool) -> Iterator[tuple[tuple, dict, list[str]]]:
    """Yield ``(args, kwargs, notes)`` with half tensors as float32; ``model`` likewise inside."""
    if not enabled:
        yield args, kwargs, []
        return
    params: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    buffers: list[tuple[torch.nn.Module, str, torch.Tensor]] = []
    seen: set[int] = set()
    try:
        for m in model.modules():
            for p in m._parameters.values():
                if p is not None and p.dtype in HALF and id(p) not in seen:
                    seen.add(id(p))
                    params.append((p, p.data))
                    p.data = p.data.float()
            for name, b in list(m._buffers.items()):
                if b is not None and b.dtype in HALF:
                    buffers.append((m, name, b))
                    m._buffers[name] = b.float()
        new_args, new_kwargs = _cast(args), _cast(kwargs)
        inputs_cast = any(a is not b for a, b in zip(new_args, args)) or any(
            new_kwargs[k] is not kwargs[k] for k in kwargs)
        notes = []
        if params or buffers or inputs_cast:
            notes.append(f"cast_to_float32: {len(params)} parameter(s), {len(buffers)} buffer(s)"
                         + (" and the example inputs" if inputs_cast else "")
                         + " cast from half precision to float32 for the export (the model is restored afterwards)")
        yield new_args, new_kwargs, notes
    finally:
        for p, data in params:
            p.data = data
        for m, name, b in buffers:
            m._buffers[name] = b
