"""The public entry points: :func:`export` (capture -> passes -> emit) and :func:`lower`."""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from .capture import capture_program, normalize_inputs
from .emit.emitter import emit
from .emit.writer import serialize
from .model import CircleModel, ExportReport
from .precision import check_precision
from .passes import default_pipeline, finalize_pipeline, run_passes
from .program import Program
from .progress import NullProgress, print_timings, progress_for
from .quant.config import QuantConfig
from .quant.plan import QuantPlan, quant_plan


def capture(model, example_inputs, example_kwargs=None, dynamic_shapes=None,
            switch_implementations: bool = True, cast_to_float32: bool = False) -> Program:
    """``torch.export`` the model and lift it into a :class:`Program` (no passes run).

    ``switch_implementations``: a ``transformers`` model runs with export-friendly experts
    (MoE) and attention implementations while it is captured, then is restored exactly
    (see :mod:`circle_fx.transformers_compat`). ``cast_to_float32``: capture a float16 /
    bfloat16 model in float32 (onert 0.1.0 runs no FLOAT16 tensor), restoring it afterwards."""
    args, kwargs = normalize_inputs(model, example_inputs, example_kwargs)
    return capture_program(model, args, kwargs, dynamic_shapes, switch_implementations, cast_to_float32)


def export(model, example_inputs, *, example_kwargs: dict | None = None, dynamic_shapes: Any = None,
           passes: Iterable[Callable] | None = None, external_weights: bool | None = None,
           verbose: bool | None = None, switch_implementations: bool = True,
           cast_to_float32: bool = False, quant_target: str | None = None,
           quantize: str | QuantConfig | None = None, verify: bool = True,
           clamp_indices: bool = True, quant_report=None) -> CircleModel:
    """Convert an unpatched PyTorch model into a Circle model.

    ``passes`` replaces the default optimisation pipeline (see
    :func:`circle_fx.default_pipeline` to extend it instead). ``external_weights`` forces
    (True) or forbids (False) storing weights after the flatbuffer; by default they are
    stored outside only when they exceed the 2 GB flatbuffer limit.
    ``verbose``: ``None`` shows a progress bar on a terminal once the conversion takes
    over a second; ``True`` shows it at once and prints stage timings to stderr;
    ``False`` is silent. No bar is drawn when stderr is not a TTY.
    ``quant_target``: for a statically quantized model (PT2E ``convert_pt2e`` output, see
    :mod:`circle_fx.quant`), ``"onert"`` (default: integer FC/ADD/MUL, float islands where
    onert has no integer kernel, e.g. DEQUANTIZE -> RMS_NORM -> QUANTIZE) or ``"npu"`` (also a
    fully quantized RMS_NORM, which no public runtime runs).
    ``quantize``: ``"int8-weights"`` (or a :class:`circle_fx.QuantConfig`) stores linear weights
    as int8 and embedding tables as uint8, one scale per row; activations stay float32.
    ``"q4_0"`` of a transformers causal LM first runs the model on 256 seeded random token ids to weight
    the Q4_0 scales (data-free calibration, ``QuantConfig.calibration``; ``summary()`` says on what).
    ``verify``: check the emitted file with :func:`circle_fx.verify` before returning it
    (a malformed file is a :class:`VerifyError` here, not a crash inside onert later); it
    costs a few percent of the export time (``benchmarks/convert_speed.py``). ``False``
    skips it.
    ``clamp_indices``: every GATHER indexed by a model input gets its indices clamped to the
    table (MINIMUM/MAXIMUM), so no input value makes onert read outside it; the valid range is
    recorded in the file either way (``circle_fx.limits`` metadata, checked by ``run``).
    ``False`` leaves the indices as they are (see benchmarks/index_clamp.py for the cost).
    ``quant_report``: a :func:`circle_fx.quant.report.quantization_report` of the calibrated
    (prepared) model, kept on the result and printed by ``summary()``.
    """
    plan = quant_plan(quantize, quant_target).fitted(model)  # a bad value fails before the (slow) capture
    plan = plan.calibrated(model)  # q4_0's data-free importance needs the eager model (quant/plan.py)
    report = ExportReport(quant_report=quant_report)
    with progress_for(verbose) as progress:
        progress.stage("torch.export", 1)
        t0 = time.perf_counter()
        program = capture(model, example_inputs, example_kwargs, dynamic_shapes, switch_implementations,
                          cast_to_float32)
        t1 = time.perf_counter()
        progress.update()
        cm = lower(program, passes=passes, external_weights=external_weights, report=report,
                   capture_seconds=t1 - t0, progress=progress, quantize=plan, verify=verify, clamp_indices=clamp_indices)
    if verbose:
        print_timings(report.timings)
    return cm


def lower(program: Program, *, passes=None, external_weights=None, report: ExportReport | None = None,
          capture_seconds: float = 0.0, progress: NullProgress | None = None,
          quant_target: str | None = None, quantize: str | QuantConfig | QuantPlan | None = None,
          verify: bool = True, clamp_indices: bool = True, weight_cache: dict | None = None) -> CircleModel:
    """Run passes over an already captured :class:`Program` and emit it.

    ``quantize`` / ``quant_target`` as for :func:`export` (or ``quantize`` a
    :class:`~circle_fx.quant.plan.QuantPlan` resolved before): the plan puts the Q/DQ passes
    around ``passes`` for a graph with quantize/dequantize nodes (so fusions see through them), or
    constant folding and the weight quantization pass after ``passes`` (so fusions and any weight
    merging see float weights, merged weights get one scale per merged row, and a weight a fusion
    left as a constant expression is one constant by then).
    ``verify`` as for :func:`export`: inline models are checked here; a model with external
    weights (> 2 GB) is checked when saved, on the written file, before it is renamed into place.
    ``weight_cache``: one dict passed to several lowerings of the same model's weights (export_llm's
    decode and prefill programs), so ``quantize`` packs each weight once and the models share it.
    """
    report = report or ExportReport()
    progress = progress or NullProgress()
    t1 = time.perf_counter()
    pipeline = default_pipeline() if passes is None else list(passes)
    pipeline = quant_plan(quantize, quant_target).pipeline(program, pipeline, weight_cache)
    finalize = finalize_pipeline()
    progress.stage("passes", len(pipeline) + len(finalize))
    for p in [*pipeline, *finalize]:  # one pass at a time, so the bar moves per pass
        run_passes(program, [p], report.pass_timings)
        progress.update()
    # after the passes: a float16 constant folded into a float32 op (a widened norm weight) is fine
    check_precision(program)
    report.fusions = program.fusions()
    report.notes = [*program.implementations, *program.qdq_notes]
    report.quantization = program.quantization
    t2 = time.perf_counter()
    builder = emit(program, progress=progress, clamp_indices=clamp_indices)
    builder.share_buffers()  # each distinct constant stored once (tied weights, per-layer masks)
    serialized = serialize(builder, external=external_weights)
    t3 = time.perf_counter()
    report.timings = {"export": capture_seconds, "passes": t2 - t1, "emit": t3 - t2}
    cm = CircleModel(builder, serialized, report)
    if verify:
        cm.check()
        report.timings["verify"] = time.perf_counter() - t3
    return cm


def entry_buckets(models: list, selector: str, bounds: list, names: list):
    """Several exported models of the same inputs and outputs as ONE entry point of
    :func:`entry_points`: model ``k`` runs when input ``selector`` is below ``bounds[k]``, the last
    one otherwise (an IF chain, :class:`~circle_fx.emit.entry_points.Buckets`); ``names``: their
    subgraphs' names."""
    from .emit.entry_points import Buckets

    return Buckets(selector, list(bounds), [cm.builder for cm in models], list(names))


def entry_points(models: list, verify: bool = True) -> CircleModel:
    """One Circle model holding two exported models as entry points ``[(name, CircleModel), ...]``:
    a subgraph and a SignatureDef each, every distinct constant buffer stored once, and subgraph
    0 an IF on a bool ``entry`` input that runs the first (True) or the second (False), so one
    onert 0.1.0 session serves both (circle_fx/emit/entry_points.py says how and why). An entry
    point may be a :class:`~circle_fx.emit.entry_points.Buckets` of builders (an IF chain)."""
    from .emit.entry_points import Buckets, dispatch

    builder = dispatch([(name, cm if isinstance(cm, Buckets) else cm.builder) for name, cm in models])
    cm = CircleModel(builder, serialize(builder), ExportReport())
    if verify:
        cm.check()
    return cm


# a direct ``import circle_fx.api`` registers what ``circle_fx.export`` needs (circle_fx/__init__ is lazy)
from . import load_compiler as _load_compiler  # noqa: E402

_load_compiler()
