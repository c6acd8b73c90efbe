"""Data-free calibration: Q4_0 importance from token ids the model generates itself.

``quantize="q4_0"`` with no calibration text still weights each Q4_0 block's scale by what each
input column of the linear carries (:mod:`circle_fx.quant.importance`). The ids come from the
model (:func:`generated_importance`): ``SEQUENCES`` x ``TOKENS`` seeded random ids after the BOS
token, every one replaced by a sample of the model's own next-token prediction at the position
before it (one forward pass), then a second forward pass with forward pre-hooks on every
``nn.Linear`` averages ``x^2`` per input column (the hooks observe, change nothing and are removed
afterwards). Two forward passes of 512 tokens: the export of SmolLM2-135M takes a few seconds
longer (benchmarks/README.md). Sampling token by token with the KV cache would be real text,
but its 128 sequential steps took 400 s on this (loaded) 2-core machine, and measured no better.

Why ids of the model's own making rather than a built-in corpus:

- it needs no tokenizer: a model given to ``circle_fx.export(model, ids)`` comes without one, and
  a GGUF checkpoint (SmolLM2's) has no ``tokenizer.json`` next to it;
- it is in the model's own vocabulary and distribution, whatever language it was trained on,
  rather than English prose picked by us;
- it cannot overlap an evaluation text (benchmarks/quant_accuracy.py evaluates on pydoc
  "execmodel"; its calibrated row uses four other pydoc topics).

What the importance mostly captures, the few input columns with activations tens of times larger
than the rest, is a property of the trained weights that any input exercises; what it misses is
the text's domain: measured on SmolLM2-135M (lm_head Q8_0, every linear Q4_0, 512 tokens of
"execmodel"): plain +16.8 % perplexity, this default +4.1 %, calibrated on pydoc text +1.9 %.

:func:`generated_importance` returns ``(Importance, None)`` or ``(None, why)`` when the model is
no causal LM it can run on ids (no ``prepare_inputs_for_generation``/``config.vocab_size``, a
weightless model whose weights are streamed from a checkpoint, or its forward fails): the
export then uses the plain Q4_0 scale search and ``summary()`` says why.
"""
from __future__ import annotations

import time

import torch
from torch import nn

#: sequences in one batch, and tokens per sequence
SEQUENCES = 2
TOKENS = 256
#: forward passes (see :func:`generated_importance`)
PASSES = 2
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
                         passes: int = PASSES, seed: int = SEED):
    """``(Importance, None)`` from ``sequences`` x ``tokens`` tokens of the model's own making (names
    relative to ``model``), or ``(None, reason)``. ``Importance.source`` says what it was calibrated on.

    The text is sampled in parallel, not token by token (a token-by-token loop of 512 tokens took
    400 s on SmolLM2-135M on this 2-core machine, the whole export 30 s): the sequences start as
    seeded random ids after the BOS token; each of ``passes - 1`` forward passes replaces every
    token by a sample (top-``TOP_K``) of the model's prediction at the position before it, and the
    last pass is the one measured. ``passes=1`` measures the random ids themselves."""
    from .importance import LinearStats

    lm = causal_lm(model)
    if lm is None:
        return None, "not a transformers causal LM (nothing to generate calibration text with)"
    if _weightless(model):
        return None, "its weights are streamed from the checkpoint (no float copy to run)"
    cfg = lm.config
    vocab = cfg.vocab_size
    start = cfg.bos_token_id if isinstance(cfg.bos_token_id, int) and 0 <= cfg.bos_token_id < vocab else None
    gen = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    training = model.training
    model.eval()
    stats = LinearStats(model)
    ids = torch.randint(0, vocab, (sequences, tokens), generator=gen)
    if start is not None:
        ids[:, 0] = start
    try:
        with torch.no_grad():
            for k in range(passes):
                if k == passes - 1:
                    with stats:
                        lm(input_ids=ids, use_cache=False)
                    break
                logits = lm(input_ids=ids, use_cache=False).logits[:, :-1].float()
                top, idx = logits.topk(min(TOP_K, logits.shape[-1]), -1)
                pick = torch.multinomial(torch.softmax(top, -1).reshape(-1, top.shape[-1]), 1, generator=gen)
                ids = torch.cat([ids[:, :1], idx.gather(-1, pick.reshape(*top.shape[:2], 1))[..., 0]], 1)
    except Exception as e:  # the model's own code: it cannot be run this way
        return None, f"running it on token ids failed ({type(e).__name__}: {str(e)[:120]})"
    finally:
        model.train(training)
    imp = stats.importance(samples=sequences)
    if imp is None:
        return None, "no nn.Linear ran on the generated ids"
    how = ("random token ids" if passes == 1 else
           f"random token ids resampled {passes - 1}x from the model's own next-token predictions")
    imp.source = (f"{sequences} x {tokens} tokens the model generated itself (data-free: {how}, "
                  f"top-{TOP_K}, seed {seed}; {time.perf_counter() - t0:.1f} s)")
    return imp, None
