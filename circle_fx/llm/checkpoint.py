"""Checkpoints in: a ``save_pretrained`` directory or a ``.gguf`` file -> (model, tokenizer).

By default (``lazy=True``) the model is built *without its weights* and reads each one from
the checkpoint only when ``export_llm`` quantizes or writes it (:mod:`circle_fx.llm.weights`:
safetensors shards, or a GGUF file's tensors dequantized one at a time): a 3B model converts
without its 12 GB float copy. The files are checked first (shards, sizes, tensor types, the
config's shapes), so a bad checkpoint fails before anything is captured or written. A
checkpoint that module does not read (``pytorch_model.bin``, a GGUF architecture whose
tensors transformers merges or splits), or ``lazy=False`` (an eager run of the model is
wanted: ``--check``, ``--calibration``), is read whole by transformers as before.

transformers does the whole reading (``AutoModelForCausalLM`` / ``AutoTokenizer``; a GGUF file
through its GGUF loader, which dequantizes every tensor to float), always as float32:
onert 0.1.0 runs no float16 and ``export_llm`` re-quantizes with circle_fx's own modes
(``quantize=``) if asked. Whatever fails while reading becomes one ``InputError`` naming
the path and transformers' reason. transformers' progress bars (GGUF loading draws one per
tensor group) are kept off the terminal.
"""
from __future__ import annotations

import contextlib
import io
import os

from ..errors import InputError


def is_checkpoint(path: str) -> bool:
    """A path export-llm reads as a checkpoint (not ``MODULE:FACTORY``)."""
    return os.path.isdir(path) or path.lower().endswith(".gguf")


def _source(path: str) -> tuple[str, dict]:
    if path.lower().endswith(".gguf"):
        if not os.path.isfile(path):
            raise InputError(f"{path}: no such GGUF file")
        return os.path.dirname(os.path.abspath(path)), {"gguf_file": os.path.basename(path)}
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise InputError(f"{path}: not a save_pretrained checkpoint directory (no config.json); give the directory "
                         "written by model.save_pretrained, a .gguf file, or MODULE:FACTORY")
    return path, {}


def _lazy(path, where, kw):
    from .weights import open_checkpoint

    return open_checkpoint(path, where, kw)


@contextlib.contextmanager
def _quiet():
    with contextlib.redirect_stderr(io.StringIO()):
        yield


def load_checkpoint(path, tokenizer: bool = True, lazy: bool = True):
    """``(model, tokenizer or None)`` from ``path``; the model is float32, in eval mode
    (``lazy``: weightless, its weights read by ``export_llm`` as it packs them; runs in eager
    give nothing meaningful).

    A checkpoint without tokenizer files gives ``None`` (the package then takes ids only)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = os.fspath(path)
    where, kw = _source(path)
    try:
        with _quiet():
            model = _lazy(path, where, kw) if lazy else None
            if model is None:
                model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kw)
    except InputError:
        raise
    except Exception as e:
        raise InputError(f"{path}: transformers could not load a causal LM from it: {type(e).__name__}: "
                         f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}") from e
    tok = None
    if tokenizer:
        try:
            with _quiet():
                tok = AutoTokenizer.from_pretrained(where, **kw)
        except Exception:  # no tokenizer files: a package of ids
            tok = None
        if tok is not None and getattr(tok, "backend_tokenizer", None) is None:
            tok = None
    return model.eval(), tok
