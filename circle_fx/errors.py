"""Exception types: every failure a user can cause surfaces as one of these.

All derive from :class:`CircleFxError`, so callers can catch one type; each message
names what is wrong and where (op, node, source line) so nobody has to read a deep
traceback to find the cause.
"""
from __future__ import annotations


class CircleFxError(Exception):
    """Base class of every error circle_fx raises on purpose."""


class InputError(CircleFxError, TypeError):
    """The model or example inputs handed to :func:`circle_fx.export` are malformed."""


class CaptureError(CircleFxError):
    """``torch.export`` rejected the model; the message summarises why and hints a fix."""


class ModelError(CircleFxError):
    """The model's own code (transformers, or a custom model) raised while circle_fx read its
    config or ran it (``export_llm``); the message names the family, the cause and where."""


class PassError(CircleFxError):
    """A pass raised or left the graph invalid; the message names the pass."""


class UnsupportedOpError(CircleFxError):
    """One or more ops have no Circle lowering. ``.ops`` lists ``(op, node, source)``."""

    def __init__(self, message: str, ops: list[tuple[str, str, str]] | None = None):
        super().__init__(message)
        self.ops = ops or []


class LegalizeError(UnsupportedOpError):
    """After a legalization step (``emit/legalize/``), an operator is still beyond what onert
    0.1.0 runs (the Circle op table, ``circle/op_table.py``): ``.step`` names the step, ``.problems`` the operators."""

    def __init__(self, message: str, step: str = "", problems: list[str] | None = None,
                 ops: list[tuple[str, str, str]] | None = None):
        super().__init__(message, ops)
        self.step = step
        self.problems = problems or []


class UnsupportedDtypeError(CircleFxError):
    """A tensor's dtype has no Circle equivalent (or no lowering for that op)."""


class VerifyError(CircleFxError):
    """An emitted Circle file failed structural verification; ``.problems`` lists why."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems or []


class OutputError(CircleFxError):
    """The output path cannot be written (checked before converting); names the user's path."""


class RuntimeFailure(CircleFxError):
    """onert could not load or execute an emitted model."""
