""":class:`CircleModel`: the result of an export — bytes, a runner, and a report."""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from .circle.activation_ranges import range_lines, widest_activation_ranges
from .circle import int4
from .circle.ggml import block_type
from .circle.schema import CIRCLE_TO_NUMPY, op_name, type_name
from .emit.builder import ModelBuilder
from .emit.writer import Serialized, write_atomic
from .circle.runtime import EXTERNAL_WHY, check_index_range
from .errors import InputError, OutputError, RuntimeFailure


@dataclass
class ExportReport:
    timings: dict[str, float] = field(default_factory=dict)
    #: the program's applied fusions (``FusionRecord`` s: strings only, no FX nodes), taken
    #: from its fusion log when the passes finished
    fusions: list = field(default_factory=list)
    pass_timings: dict[str, float] = field(default_factory=dict)
    #: what capture changed for the export (e.g. transformers implementations switched)
    notes: list = field(default_factory=list)
    #: what the weight quantization pass did (``circle_fx.quant.weight_only.QuantizationRecord``)
    quantization: object = None
    #: a static quantization report (``circle_fx.quant.report.QuantizationReport``) passed to export
    quant_report: object = None


class CircleModel:
    """An emitted Circle model.

    ``save(path)`` writes it atomically; ``to_bytes()`` returns the file content;
    ``run(*inputs)`` executes it in onert; ``summary()`` describes it.
    It keeps no reference to the FX graph it came from (that can be large: weights held as
    attributes, node metadata); the report has what the summary needs.
    """

    def __init__(self, builder: ModelBuilder, serialized: Serialized, report: ExportReport):
        self.builder = builder
        self.serialized = serialized
        self.report = report
        self._session = None
        self._session_path: str | None = None  # a temp file run() wrote (removed with the model)
        self._remote: dict = {}  # id(runtime) -> (runtime, its session): run(runtime=...)
        #: the file this model was loaded from (``CircleModel.load``), run in place
        self.source_path: str | None = None
        #: True once :func:`circle_fx.verify` passed on these bytes (``export(verify=True)``)
        self.verified = False
        self._verify_written = False  # external weights: verify the written file instead

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CircleModel":
        """An existing ``.circle`` file as a runnable model: verified first (a corrupt or
        truncated file raises :class:`~circle_fx.errors.VerifyError` naming it, instead of
        crashing onert and the process); ``run``, ``summary``, ``save`` work as after export."""
        from .circle.reader import file_bytes, read_circle
        from .circle.runtime import check_loadable

        path = os.fspath(path)
        check_loadable(path)
        cm = cls(ModelBuilder.from_file(read_circle(path)), Serialized(file_bytes(path)), ExportReport())
        cm.source_path = path
        cm.verified = True
        return cm

    def check(self) -> None:
        """Verify the emitted model (:func:`circle_fx.verify`); what ``export(verify=True)`` calls.

        Inline models are checked at once on the flatbuffer as built (the large weights are
        not copied in: verify needs only structure). A model with external weights is checked
        when written, on the temp file before it is renamed into place, so a >2 GB model is
        never copied in memory and an invalid file is never left at the user's path."""
        if self.serialized.external:
            self._verify_written = True
            return
        _verified(self, "the emitted model")
        self.verified = True

    def _write(self, path: str) -> None:
        check = None
        if self._verify_written and not self.verified:
            def check(tmp):
                _verified(tmp, path)
                self.verified = True
        write_atomic(path, self.serialized, check=check)

    # ---------------------------------------------------------------- output
    def save(self, path: str | os.PathLike) -> str:
        """Write the model to ``path`` via a temp file and rename (never half-written).

        A path that cannot be written raises :class:`~circle_fx.errors.OutputError` naming it."""
        from .paths import check_output_path

        path = check_output_path(path)
        if not path.endswith(".circle"):
            import warnings

            warnings.warn(f"{path}: onert only loads files named *.circle", stacklevel=2)
        try:
            self._write(path)
        except OSError as e:  # e.filename may be the temp file: name the user's path only
            raise OutputError(f"{path}: cannot write: {e.strerror or e}") from None
        return path

    def to_bytes(self) -> bytes:
        return self.serialized.to_bytes()

    @property
    def size(self) -> int:
        return self.serialized.size

    # ------------------------------------------------------------------- run
    def run(self, *inputs, runtime=None) -> list[np.ndarray]:
        """Execute in onert; inputs are tensors or arrays, in the model's input order.
        ``runtime``: another onert to run in, an object with ``session(path, verified)`` such as
        :class:`circle_fx.circle.arm64.Arm64Runtime` (onert's aarch64 build under qemu); None: the local onert."""
        from .circle.runtime import OnertSession, temp_circle_path

        if len(inputs) == 1 and isinstance(inputs[0], (tuple, list)):
            inputs = tuple(inputs[0])
        if len(inputs) != len(self.builder.inputs):
            raise InputError(f"model takes {len(self.builder.inputs)} input(s) "
                             f"{self.builder.input_names}, got {len(inputs)}")
        arrays = [self._check_input(k, x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x))
                  for k, x in enumerate(inputs)]
        if self._session is None or runtime is not None:
            if not self.verified:  # onert segfaults on a malformed file: never hand it one unchecked
                self.check()
            if self.serialized.external:  # refused before a multi-GB temp file is written
                raise RuntimeFailure(f"onert 0.1.0 cannot run this model: {EXTERNAL_WHY}")
            path = self.source_path
            if path is None or not path.endswith(".circle"):  # onert picks its loader by extension
                if self._session_path is None:
                    self._session_path = temp_circle_path()
                    self._write(self._session_path)
                path = self._session_path
            if runtime is not None:  # one session per runtime, kept as the local one is
                key = id(runtime)
                if key not in self._remote:
                    self._remote[key] = (runtime, runtime.session(path, verified=True))
                return self._remote[key][1].run(arrays)
            self._session = OnertSession(path, verified=True)
        return self._session.run(arrays)

    def _check_input(self, k: int, array: np.ndarray) -> np.ndarray:
        """Shape and dtype against the model's input tensor: onert runs a wrongly shaped input
        without complaint (and returns garbage), so mismatches are caught here."""
        t = self.builder.tensors[self.builder.inputs[k]]
        want = t.shape_signature if t.shape_signature is not None else t.shape
        name = self.builder.input_names[k]
        if array.ndim != len(want) or any(w != -1 and w != d for w, d in zip(want, array.shape)):
            raise InputError(f"input {name!r} has shape {list(array.shape)}; the model expects {want}"
                             + (" (-1: any size)" if -1 in want else
                                " (export with dynamic_shapes for other sizes)"))
        for d, size in enumerate(array.shape):
            largest = self.builder.input_limits.get((name, d))
            if largest is not None and size > largest:
                raise InputError(f"input {name!r} has size {size} in dim {d}; the model was exported for at most "
                                 f"{largest} there (the dynamic dim's max), and is only correct up to it")
        dtype = CIRCLE_TO_NUMPY[t.type]
        if array.dtype != dtype:
            if array.dtype.kind != dtype.kind:
                raise InputError(f"input {name!r} has dtype {array.dtype}; the model expects {dtype}")
            array = array.astype(dtype)
        check_index_range(name, array, self.builder.index_ranges.get(name))
        return array

    def __del__(self):
        path = getattr(self, "_session_path", None)
        if path and os.path.exists(path):
            try:
                os.unlink(path)
            except OSError:
                pass

    # --------------------------------------------------------------- reports
    def op_histogram(self) -> Counter:
        return Counter(op_name(op.code) for op in self.builder.operators)

    def weight_bytes_by_dtype(self) -> dict[str, int]:
        """Constant bytes per stored dtype (``{"int8": ..., "float32": ...}``; GGML blocks and packed
        4-bit weights by their Circle type, ``GGML_Q4_0``, ``INT4``), largest first;
        each buffer counted once, even when two tensors share it (tied weights)."""
        packed = {t.buffer: type_name(t.type) for t in self.builder.tensors
                  if block_type(t.type) is not None or int4.is_int4(t.type)}
        by: Counter = Counter()
        meta = set(self.builder.metadata.values())  # circle_fx.limits is not a weight
        for i, arr in enumerate(self.builder.buffers):
            if arr is not None and i not in meta:
                by[packed.get(i, str(arr.dtype))] += arr.nbytes
        return dict(by.most_common())

    def summary(self) -> str:
        b = self.builder
        lines = ["circle_fx model summary", "=" * 23]
        lines.append(f"inputs : " + ", ".join(f"{n}{list(b.tensors[i].shape)}" for n, i in zip(b.input_names, b.inputs)))
        lines.append(f"outputs: " + ", ".join(f"{n}{list(b.tensors[i].shape)}" for n, i in zip(b.output_names, b.outputs)))
        if b.input_limits:
            lines.append("largest sizes (the model is exact up to them; run() checks, a host using the file must): "
                         + ", ".join(f"{n} dim {d} <= {m}" for (n, d), m in sorted(b.input_limits.items())))
        lines.append(f"operators: {len(b.operators)}   tensors: {len(b.tensors)}   "
                     f"buffers: {sum(1 for x in b.buffers if x is not None)}   "
                     f"weight bytes: {b.weight_bytes():,}   file bytes: {self.size:,}"
                     + ("  (external weights)" if self.serialized.external else ""))
        if b.shared[0]:
            lines.append(f"shared buffers: {b.shared[0]} repeated constant(s) stored once, "
                         f"{b.shared[1]:,} bytes saved")
        lines.extend(f"note: {note}" for note in self.report.notes)
        lines.append("weight bytes by dtype: " + ", ".join(
            f"{dt} {n:,} ({100 * n / max(1, b.weight_bytes()):.1f}%)" for dt, n in self.weight_bytes_by_dtype().items()))
        if self.report.quantization is not None:
            lines.extend(self.report.quantization.lines())
        if self.report.quant_report is not None:
            lines.extend(self.report.quant_report.lines())
        lines.extend(range_lines(widest_activation_ranges(b.tensors, lambda i: b.tensors[i].buffer != 0
                                                          and b.buffers[b.tensors[i].buffer] is not None)))
        lines.append("")
        lines.append("op histogram:")
        for name, count in self.op_histogram().most_common():
            lines.append(f"  {name:<20} {count}")
        lines.append("")
        fusions = self.report.fusions
        lines.append(f"fusions applied: {len(fusions)}")
        by_source = Counter((f.kind, "+".join(f.rules), f.source) for f in fusions)
        for (kind, rules, source), count in by_source.items():
            lines.append(f"  {kind} x{count} [{rules}] from {source}")
        if self.report.timings:
            lines.append("")
            lines.append("timings: " + ", ".join(f"{k} {v:.3f}s" for k, v in self.report.timings.items()))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"<CircleModel {len(self.builder.operators)} ops, {self.size:,} bytes, "
                f"{len(self.report.fusions)} fusions>")


def _verified(src, name: str) -> None:
    """:func:`circle_fx.verify` ``src``; a failure is circle_fx's own bug, and says so."""
    from .circle.verify import verify
    from .errors import VerifyError

    try:
        verify(src)
    except VerifyError as e:
        raise VerifyError(f"circle_fx emitted an invalid Circle file ({name}); this is a circle_fx bug, please "
                          f"report it (export(..., verify=False) skips the check):\n{e}", e.problems) from None
