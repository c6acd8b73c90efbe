"""The public entry points: :func:`export` (capture -> passes -> emit) and :func:`lower`."""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from .capture import export_program, normalize_inputs, program_from_export
from .emit.emitter import emit
from .emit.writer import serialize
from .model import CircleModel, ExportReport
from .passes import default_pipeline, finalize_pipeline, run_passes
from .program import Program


def capture(model, example_inputs, example_kwargs=None, dynamic_shapes=None) -> Program:
    """``torch.export`` the model and lift it into a :class:`Program` (no passes run)."""
    args, kwargs = normalize_inputs(model, example_inputs, example_kwargs)
    ep = export_program(model, args, kwargs, dynamic_shapes)
    return program_from_export(ep)


def export(model, example_inputs, *, example_kwargs: dict | None = None, dynamic_shapes: Any = None,
           passes: Iterable[Callable] | None = None, external_weights: bool | None = None,
           verbose: bool = False) -> CircleModel:
    """Convert an unpatched PyTorch model into a Circle model.

    ``passes`` replaces the default optimisation pipeline (see
    :func:`circle_fx.default_pipeline` to extend it instead). ``external_weights`` forces
    (True) or forbids (False) storing weights after the flatbuffer; by default they are
    stored outside only when they exceed the 2 GB flatbuffer limit.
    """
    report = ExportReport()
    t0 = time.perf_counter()
    program = capture(model, example_inputs, example_kwargs, dynamic_shapes)
    t1 = time.perf_counter()
    return lower(program, passes=passes, external_weights=external_weights, report=report,
                 capture_seconds=t1 - t0)


def lower(program: Program, *, passes=None, external_weights=None, report: ExportReport | None = None,
          capture_seconds: float = 0.0) -> CircleModel:
    """Run passes over an already captured :class:`Program` and emit it."""
    report = report or ExportReport()
    t1 = time.perf_counter()
    pipeline = default_pipeline() if passes is None else list(passes)
    run_passes(program, pipeline, report.pass_timings)
    run_passes(program, finalize_pipeline(), report.pass_timings)
    report.fusions = list(program.gm.meta.get("circle_fx.fusions", {}).values())
    t2 = time.perf_counter()
    builder = emit(program)
    serialized = serialize(builder, external=external_weights)
    t3 = time.perf_counter()
    report.timings = {"export": capture_seconds, "passes": t2 - t1, "emit": t3 - t2}
    return CircleModel(builder, serialized, report, program)
