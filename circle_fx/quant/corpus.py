"""The built-in calibration corpus: English technical prose and code every Python install has.

``quantize="q4_0"`` calibrates without being given text. With a tokenizer (``export_llm`` and
``export-llm`` have the package's), it runs the model on this corpus; without one (``export`` of a
bare model), on seeded random ids (:mod:`circle_fx.quant.datafree`).

Why real text: the importance-weighted scale search weights each input column by what it
carries, and text carries it as the model will see it. Measured on SmolLM2-135M (every linear Q4_0,
the tied table Q8_0, eager, 512 tokens each of pydoc "execmodel" and of CPython's LICENSE, neither
in the corpus; benchmarks/README.md "The q4_0 default on the built-in corpus"): importance from
this corpus +3.5 % / +11.8 %, from four other pydoc topics +3.8 % on "execmodel", from seeded
random ids +5.1 %. GPTQ (:mod:`circle_fx.quant.gptq_q4`) on this corpus was *worse* than the
search alone (+4.7 % / +18.5 %), on random ids +27.8 %: with a few thousand tokens its Hessians
fit the calibration text, so it is opt-in (``activation_importance(..., gptq=True)``), not the default.

Why this text: ``pydoc_data.topics`` ships with CPython (no download, no file to find): ~80 help
topics of the language reference, prose with code. ``TOPICS`` of them, evenly spaced in sorted
order, the first ``TOKENS_PER_TOPIC`` tokens of each: breadth over depth (each topic is one
subject). It leaves out ``EXCLUDED``: "execmodel", the text circle_fx's own benchmarks and tests
evaluate perplexity on (tests/checkpoint.py), so no measurement here calibrates on its evaluation
text; benchmarks/quant_accuracy.py also reports a text from outside the pydoc topics (CPython's
LICENSE). A model for another language or domain is better served by ``--calibration FILE``.
"""
from __future__ import annotations

#: pydoc topics left out of the corpus (the benchmarks' evaluation text)
EXCLUDED = ("execmodel",)
#: topics taken, evenly spaced among the sorted others
TOPICS = 16
#: tokens from the start of each topic (a topic shorter than this gives what it has)
TOKENS_PER_TOPIC = 256
#: what ``summary()`` / the CLI say the scales were calibrated on
NAME = "the built-in corpus (pydoc topics)"


def topic_names() -> list[str]:
    """The pydoc topics in the corpus, in order."""
    from pydoc_data.topics import topics

    names = sorted(k for k in topics if k not in EXCLUDED)
    step = max(1, len(names) // TOPICS)
    return names[::step][:TOPICS]


def corpus_ids(encode, bos: int | None = None) -> list[list[int]]:
    """One id sequence per corpus topic: ``encode(text) -> list[int]`` (the model's tokenizer),
    ``bos`` prepended when given and not already first."""
    from pydoc_data.topics import topics

    out = []
    for name in topic_names():
        ids = list(encode(topics[name]))[:TOKENS_PER_TOPIC]
        if bos is not None and (not ids or ids[0] != bos):
            ids = [bos, *ids[:TOKENS_PER_TOPIC - 1]]
        if len(ids) >= 2:
            out.append(ids)
    return out
