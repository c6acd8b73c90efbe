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
from .meta import CONSTANT_NAMES
from .program import Program, add_constant
from .source import source_line
from .precision import float32_for_export
from .transformers_compat import export_friendly

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


#: (pattern in torch's message, what it means for the user) — checked in order
_KNOWN_EXPORT_FAILURES = [
    (("data-dependent", "GuardOnDataDependent", "data dependent"),
     "the model's control flow depends on a tensor's *value* (a Python if/while, bool() or .item() "
     "on a tensor). A Circle graph is fixed: compute both branches and pick with torch.where(), "
     "or make the condition a Python constant"),
    (("Constraints violated", "specialized", "specialize"),
     "a dimension marked dynamic in dynamic_shapes was forced to a constant by the model code; "
     "keep that dimension static, or use torch.export.Dim.AUTO"),
    (("Dynamo failed to run FX node", "Unsupported:"),
     "torch.export could not trace a Python construct in forward; see the source line above"),
]


def _summarise_export_error(err: Exception) -> str:
    """A few lines instead of torch's page: what failed, the user's line, and a hint."""
    text = str(err).strip()
    lines = [l for l in text.splitlines() if l.strip()]
    head = lines[0].strip() if lines else type(err).__name__
    if len(head) > 300:
        head = head[:300] + " ..."
    parts = [f"torch.export could not capture the model: {type(err).__name__}: {head}"]
    details = [l.strip() for l in lines[1:] if l.strip().startswith("- ")]  # e.g. violated constraints
    parts.extend(f"  {d[:300]}" for d in details[:3])
    frames = [i for i, l in enumerate(lines) if l.strip().startswith("File ")]
    if frames:
        i = frames[-1]
        where = lines[i].strip()
        if i + 1 < len(lines) and not lines[i + 1].strip().startswith(("File ", "The error above")):
            where += ": " + lines[i + 1].strip()
        parts.append("  at " + where)
    else:
        frame = _user_frame(err)
        if frame:
            parts.append("  at " + frame)
    hint = next((h for keys, h in _KNOWN_EXPORT_FAILURES if any(k in text or k in type(err).__name__
                                                                 for k in keys)), None)
    if hint is None:
        hint = next((l.strip() for l in lines[1:] if l.strip().lower().startswith(("hint", "suggested fix"))), None)
    if hint:
        parts.append("  hint: " + hint)
    parts.append("  (torch's full message is in the chained exception)")
    return "\n".join(parts)


def _user_frame(err: Exception) -> str | None:
    """The innermost frame of the model's own code in the traceback (torch's message often
    has none): outside the torch package, else an ``nn.Module`` of torch's own."""
    import os
    import traceback

    frames = traceback.extract_tb(err.__traceback__)
    package = os.path.dirname(os.path.abspath(__file__))
    outside = [f for f in frames if "/torch/" not in f.filename and not f.filename.startswith((package, "<"))]
    modules = [f for f in frames if "/torch/nn/modules/" in f.filename]
    for f in (outside or modules)[-1:]:
        return f'File "{f.filename}", line {f.lineno}, in {f.name}: {(f.line or "").strip()}'
    return None


def _is_input_mismatch(err: Exception) -> bool:
    """A TypeError from calling forward with the example inputs (e.g. a str for a tensor)."""
    return type(err) is TypeError and any(k in str(err) for k in ("must be Tensor", "argument", "positional"))


def _has_inplace_ops(ep: ExportedProgram) -> bool:
    """In-place ops (``add_``, buffer updates) have no Circle form; functionalizing turns them
    into plain ops and buffer updates into BUFFER_MUTATION outputs, reported below."""
    for n in ep.graph.nodes:
        schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
        if schema is not None and schema.is_mutable:
            return True
    return False


def capture_program(model, args, kwargs, dynamic_shapes=None, switch_implementations: bool = True,
                    cast_to_float32: bool = False) -> Program:
    """``torch.export`` under export-friendly ``transformers`` implementations (see
    :mod:`circle_fx.transformers_compat`) and, if asked, in float32 (:mod:`circle_fx.precision`),
    lifted into a :class:`Program`; what was changed for the capture is recorded in
    ``program.implementations``. The model is restored either way."""
    with export_friendly(model, switch_implementations, kwargs) as notes, \
            float32_for_export(model, args, kwargs, cast_to_float32) as (args, kwargs, cast_notes):
        ep = export_program(model, args, kwargs, dynamic_shapes)
        # inside: constants are detached from the parameters *now* (float32 under cast_to_float32)
        program = program_from_export(ep)
    program.implementations = [*notes, *cast_notes]
    return program


def export_program(model, args, kwargs, dynamic_shapes=None) -> ExportedProgram:
    # restore each submodule's own flag: model.train(True) would also flip submodules the
    # user had put in eval mode (e.g. a frozen BatchNorm)
    training = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
    except NotImplementedError:  # an exported GraphModule (PT2E's convert_pt2e output) refuses
        pass                     # .eval(); it was traced with its mode already fixed
    try:
        with torch.no_grad():
            ep = torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes, strict=False)
            if _has_inplace_ops(ep):
                ep = ep.run_decompositions({})  # an empty table only functionalizes (x.mul_(2) -> mul)
            return ep
    except Exception as e:  # torch raises many unrelated types here
        if _is_input_mismatch(e):
            raise InputError(f"the model rejected the example inputs: {e}") from e
        if "structure of `inputs` and `dynamic_shapes`" in str(e):
            raise InputError("dynamic_shapes does not match the example inputs: "
                             + str(e).strip().splitlines()[0].split(": ", 1)[-1]) from e
        raise CaptureError(_summarise_export_error(e)) from e
    finally:
        for m, flag in training:
            m.training = flag


def program_from_export(ep: ExportedProgram) -> Program:
    """Lift the ``ExportedProgram`` into a :class:`Program` (constants as attributes).

    O(nodes + constants): one graph copy, one sweep over the placeholders. Constants are
    registered by reference (no tensor copies).
    """
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
            gm.meta.setdefault(CONSTANT_NAMES, {})[name] = spec.target  # for messages, skip lists
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
            where = f" at {source_line(value)}" if isinstance(value, fx.Node) else ""
            raise CaptureError(
                f"the model mutates buffer {spec.target!r} in forward{where}; Circle models are stateless"
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
