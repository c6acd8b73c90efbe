"""Data-free calibration: Q4_0 importance from text the model generates itself.

``quantize="q4_0"`` with no calibration text still weights each Q4_0 block's scale by what each
input column of the linear carries (:mod:`circle_fx.quant.importance`). The text comes from the
model: from its BOS token, ``SEQUENCES`` sequences of ``TOKENS`` tokens are sampled (seeded, so an
export is reproducible) with the KV cache, and forward pre-hooks on every ``nn.Linear`` average
``x^2`` per input column over every token the model read (the hooks observe; they change nothing
and are removed afterwards).

Why the model's own text rather than a built-in corpus:

- it needs no tokenizer: a model given to ``circle_fx.export(model, ids)`` comes without one, and
  a GGUF checkpoint (SmolLM2's) has no ``tokenizer.json`` next to it;
- it is text in the model's own distribution (an instruct model starts chats), in its language
  and vocabulary, whatever it was trained on, rather than English prose picked by us;
- it cannot overlap an evaluation text (benchmarks/quant_accuracy.py evaluates on pydoc
  "execmodel"; the calibrated row uses other pydoc topics).

What the importance mostly captures, the few input columns with activations tens of times larger
than the rest, is a property of the trained weights, which any fluent text exercises (measured:
benchmarks/README.md, ``quant_accuracy.py``: the default within the calibrated row's loss).

:func:`generated_importance` returns ``(Importance, None)`` or ``(None, why)`` when the model is
no causal LM it can sample from (no ``prepare_inputs_for_generation``/``config.vocab_size``, a
weightless model whose weights are streamed from a checkpoint, or its forward fails): the
export then uses the plain Q4_0 scale search and ``summary()`` says why.
"""
from __future__ import annotations

import time

import torch
from torch import nn

#: sequences sampled in one batch, and tokens per sequence (the KV cache keeps a step one token)
SEQUENCES = 4
TOKENS = 128
#: sampling: temperature 1 from the ``TOP_K`` most likely tokens (keeps a small model off junk)
TOP_K = 50
SEED = 0
#: ``export-llm`` reads a checkpoint whole (float32, in memory) to calibrate when it has at most this many
#: parameters (2.4 GB of float32; the generation takes a few seconds per 100M parameters); a larger one
#: is streamed (issue 34: no float copy) and its Q4_0 scales get the plain search unless --calibration
#: is given (which reads it whole at any size)
CALIBRATE_MAX_PARAMS = 600_000_000


def calibrates_in_memory(params: int) -> bool:
    """Should a checkpoint of ``params`` parameters be read whole so that "auto" can calibrate?"""
    return params <= CALIBRATE_MAX_PARAMS


def causal_lm(model: nn.Module):
    """The transformers causal LM in ``model`` (itself, or the first submodule that is one, for a
    wrapper such as ``ids -> model(ids).logits``), or None."""
    for m in (model, *model.modules()):
        cfg = getattr(m, "config", None)
        if hasattr(m, "prepare_inputs_for_generation") and isinstance(getattr(cfg, "vocab_size", None), int):
            return m
    return None


def _weightless(model: nn.Module) -> bool:
    """The model's parameters are placeholders or meta tensors: nothing to run. A weightless
    checkpoint model (``circle_fx.llm.weights``: its weights streamed from the checkpoint as they
    are packed) holds zero-stride placeholders, ``torch.zeros(()).expand(shape)``."""
    from ..lazy import is_lazy

    return any(p.is_meta or is_lazy(p) or (p.numel() > 1 and not any(p.stride())) for p in model.parameters())


def generated_importance(model: nn.Module, sequences: int = SEQUENCES, tokens: int = TOKENS,
                         seed: int = SEED):
    """``(Importance, None)`` from ``sequences`` x ``tokens`` tokens the model samples from its BOS
    token (names relative to ``model``), or ``(None, reason)``. ``Importance.source`` says what it
    was calibrated on."""
    from .importance import Importance, LinearStats

    lm = causal_lm(model)
    if lm is None:
        return None, "not a transformers causal LM (nothing to generate calibration text with)"
    if _weightless(model):
        return None, "its weights are streamed from the checkpoint (no float copy to run)"
    cfg = lm.config
    start = cfg.bos_token_id if isinstance(cfg.bos_token_id, int) else 0
    gen = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    training = model.training
    model.eval()
    stats = LinearStats(model)
    try:
        ids = torch.full((sequences, 1), start, dtype=torch.long)
        past, step = None, ids
        with torch.no_grad(), stats:
            for _ in range(tokens - 1):
                out = lm(input_ids=step, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[:, -1].float()
                top, idx = logits.topk(min(TOP_K, logits.shape[-1]), -1)
                nxt = idx.gather(-1, torch.multinomial(torch.softmax(top, -1), 1, generator=gen))
                ids = torch.cat([ids, nxt], 1)
                step = nxt
    except Exception as e:  # the model's own code: it cannot be sampled from this way
        return None, f"sampling from it failed ({type(e).__name__}: {str(e)[:120]})"
    finally:
        model.train(training)
    imp = stats.importance(samples=sequences)
    if imp is None:
        return None, "no nn.Linear ran while it generated"
    imp.source = (f"{sequences} x {tokens} tokens the model generated itself (data-free: sampled from token "
                  f"{start}, top-{TOP_K}, seed {seed}; {time.perf_counter() - t0:.1f} s)")
    imp.tokens = ids
    return imp, None
