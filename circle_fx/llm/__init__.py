"""Token-by-token generation: prefill + KV-cache decode models for onert.

    pkg = circle_fx.export_llm(model, max_seq_len=256)   # LLMPackage
    pkg.save("out/")                                      # prefill.circle, decode.circle, manifest.json
    runner = circle_fx.llm.LLMRunner("out/")
    tokens = runner.generate(input_ids, max_new_tokens=32)

Modules: ``cache`` (graph-side Cache and the two traced wrappers), ``export``,
``manifest`` (the JSON a host follows), ``package``, ``runner``.
"""

def __getattr__(name):  # lazy: `export` imports transformers, which the CLI's other commands never need
    if name == "export_llm":
        from .export import export_llm

        return export_llm
    if name == "LLMPackage":
        from .package import LLMPackage

        return LLMPackage
    if name == "LLMRunner":
        from .runner import LLMRunner

        return LLMRunner
    raise AttributeError(name)

__all__ = ["export_llm", "LLMPackage", "LLMRunner"]
