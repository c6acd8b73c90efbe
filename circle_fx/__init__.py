"""circle_fx: compile unpatched PyTorch models to Circle, fusing decomposed subgraphs.

    import circle_fx
    cm = circle_fx.export(model, (input_ids,))
    cm.save("model.circle"); print(cm.summary()); cm.run(input_ids)
"""
from .errors import (CaptureError, CircleFxError, InputError, ModelError, OutputError, PassError, RuntimeFailure,
                     LegalizeError, UnsupportedDtypeError, UnsupportedOpError, VerifyError)

try:  # the compiler needs torch; a device running a package does not (circle_fx.circle, circle_fx.llm.runner)
    import torch as _torch  # noqa: F401
except ImportError as _no_torch:  # pragma: no cover - exercised in tests/llm/test_llm_no_torch.py
    _NO_TORCH = _no_torch
else:
    _NO_TORCH = None
    from . import dialect  # noqa: F401  (the circle:: ops no family owns: channels-last, weight-only, quantized)
    from . import fusions  # noqa: F401  (registers the fusion families and their ops, torch.ops.circle.*)
    from .api import capture, export, lower
    from .explain import ExplainResult, explain, explain_report  # circle_fx.explain is the function; the module imports as usual
    from .model import CircleModel
    from .passes import Pass, Pipeline, default_pipeline
    from .program import Program
    from .quant import QuantConfig
    from .quant import lowerings as _quant_lowerings  # noqa: F401  (registers the quantized ops' lowerings)
from .circle.verify import VerifyReport, verify



def export_llm(model, max_seq_len, prefill_len=None, **kwargs):
    """Prefill + KV-cache decode models for a transformers causal LM: see :mod:`circle_fx.llm`.
    (Imported on first use: it needs ``transformers``, which plain exports do not.)"""
    from .llm import export_llm as _export_llm

    return _export_llm(model, max_seq_len, prefill_len, **kwargs)


__version__ = "0.1.0"

__all__ = ["export", "capture", "lower", "CircleModel", "Program", "Pass", "Pipeline", "default_pipeline",
           "CircleFxError", "CaptureError", "InputError", "ModelError", "OutputError", "PassError", "RuntimeFailure",
           "LegalizeError", "UnsupportedDtypeError", "UnsupportedOpError", "VerifyError", "verify", "VerifyReport",
           "explain", "explain_report", "ExplainResult", "export_llm", "QuantConfig"]
