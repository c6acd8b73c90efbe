"""Next-token choice with transformers' semantics: greedy, or sampling with temperature,
top-k, top-p, repetition penalty and a seed.

Each step reproduces what ``model.generate`` does with the same settings: the repetition
penalty (``RepetitionPenaltyLogitsProcessor``, over the prompt and the tokens generated so
far, also when greedy), then -- when sampling -- ``TemperatureLogitsWarper``,
``TopKLogitsWarper``, ``TopPLogitsWarper`` in that order, the same float32 torch operations,
then ``softmax`` and ``torch.multinomial``. ``seed`` seeds a private ``torch.Generator``
(a fresh one seeded with ``s`` draws the same stream as ``torch.manual_seed(s)``), so a
seeded run gives the same tokens as ``torch.manual_seed(s); model.generate(...)`` given the
same logits. Without a seed the global torch RNG is used, as transformers does.

Differences from ``GenerationConfig`` defaults, on purpose: nothing is read from the model's
generation config; ``top_k=None`` means no top-k filter (transformers' default is 50).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError


@dataclass(frozen=True)
class Sampling:
    do_sample: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None

    @classmethod
    def make(cls, do_sample=None, temperature=None, top_k=None, top_p=None, repetition_penalty=None,
             seed=None) -> "Sampling":
        """Checked settings; ``do_sample=None`` samples when temperature, top_k or top_p is given."""
        if temperature is not None and not (isinstance(temperature, (int, float)) and temperature > 0):
            raise InputError(f"temperature must be a number > 0 (greedy: leave it unset), got {temperature!r}")
        if top_k is not None and not (isinstance(top_k, int) and top_k > 0):
            raise InputError(f"top_k must be an int > 0, got {top_k!r}")
        if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
            raise InputError(f"top_p must be in (0, 1], got {top_p!r}")
        if repetition_penalty is not None and not (isinstance(repetition_penalty, (int, float))
                                                   and repetition_penalty > 0):
            raise InputError(f"repetition_penalty must be a number > 0, got {repetition_penalty!r}")
        if seed is not None and not isinstance(seed, int):
            raise InputError(f"seed must be an int, got {seed!r}")
        if do_sample is None:
            do_sample = any(v is not None for v in (temperature, top_k, top_p))
        return cls(bool(do_sample), None if temperature is None else float(temperature), top_k,
                   None if top_p is None else float(top_p),
                   None if repetition_penalty is None else float(repetition_penalty), seed)


class Chooser:
    """Picks each next token from the [V] logits and the ids so far."""

    def __init__(self, sampling: Sampling):
        self.s = sampling
        self.plain_greedy = not sampling.do_sample and sampling.repetition_penalty in (None, 1.0)
        self.generator = None
        #: torch importable: transformers' exact operations and RNG; else (a device) numpy's
        self.exact = _torch_available()
        if not self.exact:
            self.rng = np.random.default_rng(sampling.seed)
        elif sampling.do_sample and sampling.seed is not None:
            import torch

            self.generator = torch.Generator().manual_seed(sampling.seed)

    def numpy_scores(self, logits, ids: list[int]) -> np.ndarray:
        """:meth:`process` in numpy (no torch on the host): the same processors in the same order
        in float32; a sampled token then comes from numpy's RNG, so seeded tokens differ from
        transformers' (greedy and the processed scores do not)."""
        s = self.s
        scores = np.array(logits, dtype=np.float32).reshape(-1)
        V = scores.size
        if s.repetition_penalty is not None and s.repetition_penalty != 1.0:
            seen = np.unique(np.asarray([i for i in ids if 0 <= i < V], dtype=np.int64))
            v = scores[seen]
            scores[seen] = np.where(v < 0, v * np.float32(s.repetition_penalty), v / np.float32(s.repetition_penalty))
        if not s.do_sample:
            return scores
        if s.temperature is not None and s.temperature != 1.0:
            scores = scores / np.float32(s.temperature)
        if s.top_k is not None:
            k = min(s.top_k, V)
            scores = np.where(scores < np.partition(scores, V - k)[V - k], -np.inf, scores).astype(np.float32)
        if s.top_p is not None and s.top_p < 1.0:
            order = np.argsort(scores, kind="stable")
            p = np.exp(scores[order] - scores[order][-1])
            cumulative = np.cumsum(p / p.sum())
            remove = cumulative <= (1 - s.top_p)
            remove[-1] = False
            scores[order[remove]] = -np.inf
        return scores

    def process(self, logits, ids: list[int]):
        """The processed scores [1, V] (float32 torch) transformers would sample from."""
        import torch

        s = self.s
        scores = torch.from_numpy(np.array(logits, dtype=np.float32).reshape(1, -1))  # a writable copy
        V = scores.shape[-1]
        if s.repetition_penalty is not None and s.repetition_penalty != 1.0:
            seen = torch.tensor([ids], dtype=torch.long).clamp(max=V)
            padded = torch.nn.functional.pad(scores, (0, 1))
            score = torch.gather(padded, 1, seen)
            score = torch.where(score < 0, score * s.repetition_penalty, score / s.repetition_penalty)
            scores = padded.scatter(1, seen, score)[..., :V]
        if not s.do_sample:
            return scores
        if s.temperature is not None and s.temperature != 1.0:
            scores = scores / s.temperature
        if s.top_k is not None:
            k = min(s.top_k, V)
            scores = scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], -float("inf"))
        if s.top_p is not None and s.top_p < 1.0:
            sorted_logits, sorted_indices = torch.sort(scores, descending=False)
            cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
            remove = cumulative <= (1 - s.top_p)
            remove[..., -1:] = 0
            remove = remove.scatter(1, sorted_indices, remove)
            scores = scores.masked_fill(remove, -float("inf"))
        return scores

    def __call__(self, logits, ids: list[int]) -> int:
        if self.plain_greedy:
            return int(np.argmax(logits))
        if not self.exact:
            scores = self.numpy_scores(logits, ids)
            if not self.s.do_sample:
                return int(np.argmax(scores))
            p = np.exp(scores - scores.max())
            return int(self.rng.choice(scores.size, p=p / p.sum()))
        import torch

        scores = self.process(logits, ids)
        if not self.s.do_sample:
            return int(torch.argmax(scores, dim=-1))
        probs = torch.nn.functional.softmax(scores, dim=-1)
        return int(torch.multinomial(probs, num_samples=1, generator=self.generator).squeeze(1))


def _torch_available() -> bool:
    """Is torch importable here (without importing it: 230 MB of a device's memory)?"""
    import importlib.util
    import sys

    if "torch" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False
