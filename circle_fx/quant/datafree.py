"""Data-free calibration: Q4_0 importance with no calibration text.

``quantize="q4_0"`` with no calibration text still weights each Q4_0 block's scale by what each
input column of the linear carries (:mod:`circle_fx.quant.importance`). :func:`datafree_importance`
runs the model on ``SEQUENCES`` x ``TOKENS`` seeded random token ids after its BOS token, with
forward pre-hooks on every ``nn.Linear`` averaging ``x^2`` per input column (the hooks observe,
change nothing and are removed afterwards). ``passes > 1`` first replaces every id by a sample of
the model's own next-token prediction at the position before it (``passes - 1`` times: text the
model generates itself, sampled in parallel).

Which input, measured on SmolLM2-135M (every linear Q4_0, lm_head Q8_0, perplexity of 512 tokens
of pydoc "execmodel" with the file's dequantized weights; plain search +16.8 %, importance from four
other pydoc topics +1.9 %): random ids 2 x 256 +4.0 % / +5.2 % (seeds 0 / 1), 2 x 128 +4.2 %; the
model's own samples (passes 2) 2 x 256 +4.1 %, 2 x 128 +4.9 %, 2 x 64 +5.6 %; real token-by-token
generation with the KV cache, 4 x 128, no better (and its 128 sequential steps took 400 s on this
loaded 2-core machine). So the default is the cheapest: random ids, one pass over 256 tokens
(about half a 512-token forward; the export of SmolLM2 about 1.3x the plain one). What any input
captures is the few input columns whose activations are tens of times larger than the rest, a
property of the trained weights; what it misses is the text's domain (the calibrated row's lead).

Why not a built-in corpus: it needs a tokenizer, and a model given to ``circle_fx.export(model, ids)``
comes without one (a GGUF checkpoint, SmolLM2's, has no ``tokenizer.json`` next to it); random ids
are in every model's vocabulary and cannot overlap an evaluation text.

:func:`datafree_importance` returns ``(Importance, None)`` or ``(None, why)`` when the model is no
causal LM it can run on ids (no ``prepare_inputs_for_generation``/``config.vocab_size``, a
weightless model whose weights are streamed from a checkpoint, or its forward fails): the export
then uses the plain Q4_0 scale search and ``summary()`` says why.
"""
from __future__ import annotations

import time

import torch
from torch import nn

#: sequences in one batch, and tokens per sequence
SEQUENCES = 2
TOKENS = 128
#: forward passes (see :func:`datafree_importance`): 1 measures seeded random ids, cheapest and measured
#: as good as the model's own samples (benchmarks/README.md "The q4_0 default")
PASSES = 1
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
    if not isinstance(model, nn.Module):  # an ExportedProgram, a callable: nothing to hook
        return None
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


def _runnable(model):
    """``(the causal LM to run, None)``, or ``(None, why it cannot be run on token ids)``."""
    lm = causal_lm(model)
    if lm is None:
        return None, "not a transformers causal LM (no token ids to run it on)"
    if _weightless(model):
        return None, "its weights are streamed from the checkpoint (no float copy to run)"
    return lm, None


def corpus_importance(model: nn.Module, encode):
    """``(Importance, None)`` from the model run on the built-in corpus (:mod:`.corpus`) tokenized
    by ``encode``, or ``(None, reason)``: the default when the export has the model's tokenizer.
    Only the importance (mean ``x^2`` per input column) for the weighted scale search: GPTQ on so
    few tokens was measured worse out of the corpus' domain (:mod:`.corpus`)."""
    from . import corpus
    from .importance import LinearStats

    lm, why = _runnable(model)
    if lm is None:
        return None, why
    cfg = lm.config
    bos = cfg.bos_token_id if isinstance(cfg.bos_token_id, int) and 0 <= cfg.bos_token_id < cfg.vocab_size else None
    try:
        seqs = corpus.corpus_ids(encode, bos)
    except Exception as e:  # the tokenizer's own code
        return None, f"the tokenizer failed on the corpus ({type(e).__name__}: {str(e)[:120]})"
    limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    seqs = [s[:limit] if isinstance(limit, int) and limit > 1 else s for s in seqs]
    seqs = [s for s in seqs if len(s) >= 2 and all(0 <= t < cfg.vocab_size for t in s)]
    if not seqs:
        return None, "the tokenizer gave no ids inside the model's vocabulary"
    t0 = time.perf_counter()
    training = model.training
    model.eval()
    stats = LinearStats(model)
    try:
        with torch.no_grad(), stats:
            for s in seqs:
                lm(input_ids=torch.tensor([s]), use_cache=False)
    except Exception as e:  # the model's own code: it cannot be run this way
        return None, f"running it on the corpus failed ({type(e).__name__}: {str(e)[:120]})"
    finally:
        model.train(training)
    imp = stats.importance(samples=len(seqs))
    if imp is None:
        return None, "no nn.Linear ran on the corpus"
    imp.source = f"{sum(len(s) for s in seqs)} tokens of {corpus.NAME} ({time.perf_counter() - t0:.1f} s)"
    return imp, None


def saved_tokenizer(model):
    """``text -> ids`` from the tokenizer saved next to the model's weights
    (``config._name_or_path``): its ``tokenizer.json`` (a ``save_pretrained`` directory, a hub
    snapshot), or the vocabulary inside the directory's one ``.gguf`` file (a model transformers
    loaded with ``gguf_file=``); None when there is none or it cannot be read (random ids then)."""
    import contextlib
    import io
    import os

    lm = causal_lm(model)
    path = getattr(getattr(lm, "config", None), "_name_or_path", None) or ""
    if not path or not os.path.isdir(path):
        return None
    file = os.path.join(path, "tokenizer.json")
    try:
        if os.path.isfile(file):
            import tokenizers

            tok = tokenizers.Tokenizer.from_file(file)
            return lambda text: tok.encode(text, add_special_tokens=False).ids
        ggufs = [f for f in os.listdir(path) if f.endswith(".gguf")]
        if len(ggufs) != 1:
            return None
        from transformers import AutoTokenizer

        with contextlib.redirect_stderr(io.StringIO()):  # its GGUF reader prints progress bars
            hf = AutoTokenizer.from_pretrained(path, gguf_file=ggufs[0])
        return lambda text: hf(text, add_special_tokens=False).input_ids
    except Exception:  # not ours to judge here: the export goes on with random ids
        return None


def datafree_importance(model: nn.Module, sequences: int = SEQUENCES, tokens: int = TOKENS,
                         passes: int = PASSES, seed: int = SEED):
    """``(Importance, None)`` from ``sequences`` x ``tokens`` data-free token ids (names relative to
    ``model``), or ``(None, reason)``; ``Importance.source`` says what it was calibrated on. The ids
    start as seeded random ids after the BOS token; each of ``passes - 1`` forward passes replaces
    every one by a sample (top-``TOP_K``) of the model's prediction at the position before it; the
    last pass is the one measured."""
    from .importance import LinearStats

    lm, why = _runnable(model)
    if lm is None:
        return None, why
    cfg = lm.config
    vocab = cfg.vocab_size
    limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    if isinstance(limit, int) and limit > 1:  # learned position tables end there
        tokens = min(tokens, limit)
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
        return None, "no nn.Linear ran on the ids"
    how = ("seeded random token ids" if passes == 1 else
           f"random ids resampled {passes - 1}x from the model's own next-token predictions, top-{TOP_K}")
    imp.source = f"{sequences} x {tokens} data-free tokens ({how}, seed {seed}; {time.perf_counter() - t0:.1f} s)"
    return imp, None
