"""circle_fx: compile unpatched PyTorch models to Circle, fusing decomposed subgraphs.

    import circle_fx
    cm = circle_fx.export(model, (input_ids,))
    cm.save("model.circle"); print(cm.summary()); cm.run(input_ids)
"""
from .errors import (CaptureError, CircleFxError, InputError, ModelError, OutputError, PassError, RuntimeFailure,
                     LegalizeError, UnsupportedDtypeError, UnsupportedOpError, VerifyError)

#: the compiler's public names -> their module. They are imported on first use (PEP 562), not here:
#: ``circle-fx generate`` and ``circle_fx.llm.runner`` run a package with onert and numpy and must not
#: pay for torch (~230 MiB RSS, 2 s) because they import ``circle_fx`` (issue 32 item 7).
_COMPILER = {"capture": "api", "export": "api", "lower": "api", "CircleModel": "model", "Pass": "passes",
             "Pipeline": "passes", "default_pipeline": "passes", "Program": "program", "QuantConfig": "quant",
             "ExplainResult": "explain", "explain": "explain", "explain_report": "explain"}


_loading = False


def load_compiler() -> None:
    """Import the compiler: the circle:: ops, the fusion families (they register torch.ops.circle.*)
    and the quantized lowerings, then bind the public names above. Idempotent; the modules that
    need the registrations (``api``, ``explain``) call it, so a direct ``import circle_fx.api``
    behaves as ``import circle_fx`` did when it imported everything."""
    import importlib

    global _loading
    if _loading or "export" in globals():
        return
    _loading = True
    from . import dialect  # noqa: F401  (the circle:: ops no family owns: channels-last, weight-only, quantized)
    from . import fusions  # noqa: F401  (registers the fusion families and their ops, torch.ops.circle.*)
    from .quant import lowerings as _quant_lowerings  # noqa: F401  (registers the quantized ops' lowerings)

    names = {name: getattr(importlib.import_module(f".{mod}", __name__), name) for name, mod in _COMPILER.items()}
    globals().update(names)  # circle_fx.explain is the function; the module imports as usual


def __getattr__(name):
    if name in _COMPILER:
        load_compiler()
        return globals()[name]
    raise AttributeError(f"module 'circle_fx' has no attribute {name!r}")


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
