"""Capture: ``torch.export`` the user's model and turn the result into a :class:`Program`.

Input checking happens here, before tracing, so that a wrong argument type gives a short
``InputError`` instead of a trace from inside dynamo; export failures are summarised
into a ``CaptureError`` carrying torch's own hint.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from .errors import CaptureError, InputError
from .program import Program, add_constant

try:  # generates the module's Python code only when it is called (passes recompile often, emit never runs it)
    from torch.fx._lazy_graph_module import _LazyGraphModule as _GraphModule
except ImportError:  # pragma: no cover - older/newer torch without it
    _GraphModule = fx.GraphModule


def normalize_inputs(model, example_inputs, example_kwargs) -> tuple[tuple, dict]:
    if not isinstance(model, torch.nn.Module):
        raise InputError(
            f"model must be a torch.nn.Module, got {type(model).__name__}; "
            "wrap a function in a Module whose forward calls it"
        )
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if isinstance(example_inputs, list):
        example_inputs = tuple(example_inputs)
    if not isinstance(example_inputs, tuple):
        raise InputError(
            "example_inputs must be a tensor or a tuple of tensors, "
            f"got {type(example_inputs).__name__}"
        )
    example_kwargs = dict(example_kwargs or {})
    for i, value in enumerate(example_inputs):
        _check_input_value(f"example_inputs[{i}]", value)
    for key, value in example_kwargs.items():
        _check_input_value(f"example_kwargs[{key!r}]", value)
    _check_arity(model, example_inputs, example_kwargs)
    return example_inputs, example_kwargs


def _check_input_value(where: str, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            raise InputError(f"{where}: complex tensors are not supported by Circle (dtype {value.dtype})")
        return
    if value is None or isinstance(value, (bool, int, float, str)):
        return
    if isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            _check_input_value(f"{where}[{i}]", v)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            _check_input_value(f"{where}[{k!r}]", v)
        return
    import numpy as np

    if isinstance(value, np.ndarray):
        raise InputError(f"{where}: got a numpy array; pass torch.from_numpy(...) instead")
    raise InputError(f"{where}: unsupported example input type {type(value).__name__}")


def _check_arity(model, args: tuple, kwargs: dict) -> None:
    import inspect

    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        raise InputError(
            f"example inputs do not fit {type(model).__name__}.forward{sig}: {e}"
        ) from None


def _summarise_export_error(err: Exception) -> str:
    text = str(err).strip()
    lines = [l for l in text.splitlines() if l.strip()]
    head = lines[0] if lines else type(err).__name__
    hints = [l.strip() for l in lines if "hint" in l.lower() or "fix" in l.lower() or "please" in l.lower()]
    where = [l.strip() for l in lines if l.strip().startswith("File ")]
    parts = [f"torch.export could not capture the model: {type(err).__name__}: {head}"]
    if where:
        parts.append("  at " + where[-1])
    if hints:
        parts.append("  hint: " + hints[0])
    parts.append("  (circle_fx needs a model torch.export accepts with strict=False; "
                 "see the chained exception for torch's full message)")
    return "\n".join(parts)


def export_program(model, args, kwargs, dynamic_shapes=None) -> ExportedProgram:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as e:  # torch raises many unrelated types here
        raise CaptureError(_summarise_export_error(e)) from e
    finally:
        model.train(was_training)


def program_from_export(ep: ExportedProgram) -> Program:
    """Lift the ``ExportedProgram`` into a :class:`Program` (constants as attributes)."""
    graph = fx.Graph()
    out = graph.graph_copy(ep.graph, {})  # shallow-copies node.meta; the export stays intact
    graph.output(out)
    gm = _GraphModule(torch.nn.Module(), graph)
    sig = ep.graph_signature
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    constants = dict(ep.state_dict)
    constants.update(ep.constants)
    input_names: list[str] = []
    first = next((n for n in gm.graph.nodes if n.op != "placeholder"), None)
    for node, spec in zip(placeholders, sig.input_specs):
        if spec.kind == InputKind.USER_INPUT:
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                input_names.append(node.name)
                continue
            if node.users:
                raise InputError(
                    f"input {node.name!r} is a non-tensor value the graph depends on; "
                    "Circle models take tensors only"
                )
            gm.graph.erase_node(node)
            continue
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            tensor = constants[spec.target].detach()
            name = add_constant(gm, tensor, spec.target)
            with gm.graph.inserting_before(first):
                attr = gm.graph.get_attr(name)
            attr.meta.update(node.meta)
            node.replace_all_uses_with(attr)
            gm.graph.erase_node(node)
            continue
        raise CaptureError(f"unsupported exported input kind {spec.kind} for {node.name!r}")
    output = gm.graph.output_node()
    outs = output.args[0]
    keep, output_names = [], []
    for value, spec in zip(outs, sig.output_specs):
        if spec.kind == OutputKind.USER_OUTPUT:
            if not isinstance(value, fx.Node):
                raise CaptureError(f"model output {spec.arg} is a constant, not a tensor computed by the graph")
            keep.append(value)
            output_names.append(value.name)
        elif spec.kind == OutputKind.BUFFER_MUTATION:
            raise CaptureError(
                f"the model mutates buffer {spec.target!r} in forward; Circle models are stateless"
            )
    output.args = (tuple(keep),)
    output_names = _output_names(ep, len(keep)) or output_names
    gm.graph.lint()
    gm.recompile()
    return Program(gm=gm, input_names=input_names, output_names=output_names)


def _output_names(ep: ExportedProgram, count: int) -> list[str] | None:
    """Names for the Circle outputs from the model's return structure, not FX node names.

    ``CausalLMOutputWithPast(logits=...)`` gives ``logits``; a dict gives its keys; a bare
    tensor or tuple gives ``output_0``, ``output_1``... ``None`` if the structure and the
    outputs do not line up (then node names are kept).
    """
    spec = getattr(ep.call_spec, "out_spec", None)
    if spec is None:
        return None
    paths: list[tuple] = []

    def walk(s, prefix):
        if s.is_leaf():
            paths.append(prefix)
            return
        children = s.children() if callable(getattr(s, "children", None)) else s.children_specs
        keys = s.context
        if isinstance(keys, type) and hasattr(keys, "_fields"):  # namedtuple
            keys = keys._fields
        if not (isinstance(keys, (list, tuple)) and len(keys) == len(children)
                and all(isinstance(k, str) for k in keys)):
            keys = range(len(children))
        for k, c in zip(keys, children):
            walk(c, prefix + (k,))

    walk(spec, ())
    if len(paths) != count:
        return None
    names: list[str] = []
    for path in paths:
        parts = list(path)
        while parts and isinstance(parts[0], int) and any(isinstance(p, str) for p in parts):
            parts.pop(0)  # (1, "a") -> "a": the tuple position adds nothing to a key
        if all(isinstance(p, int) for p in parts):
            name = "output_" + ("_".join(map(str, parts)) if parts else "0")
        else:
            name = "_".join(map(str, parts))
        name = "".join(c if c.isalnum() or c in "_." else "_" for c in name)
        base, i = name, 1
        while name in names:
            name, i = f"{base}_{i}", i + 1
        names.append(name)
    return names
