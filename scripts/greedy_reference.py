"""Greedy generation in onert (``LLMRunner.generate``) against transformers' ``model.generate``:
the one comparison the generation tests (``tests/llm/``) and ``scripts/generation_support.py``
make, so the reference's settings and the way tokens and logits are compared are written once.

The reference is greedy with the generation config's logits processors off
(:data:`NO_PROCESSORS`): ``LLMRunner.generate`` applies none of them, so both sides pick the
plain argmax and stop only at the EOS ids given (the comparison is of the models, not of
generation-config policies). Each prompt goes through the runner twice, through the prefill
model and through decode steps only; the logits each token was picked from are compared too.

torch is imported inside the functions: ``generation_support.py`` imports this module in its
parent process, which never builds a model.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

#: logits processors a model's generation config may switch on (BART / Marian / Pegasus set
#: ``forced_eos_token_id``: the last token allowed by ``max_new_tokens`` is forced to EOS),
#: switched off in the reference (module docstring)
NO_PROCESSORS = dict(forced_bos_token_id=None, forced_eos_token_id=None, suppress_tokens=None,
                     begin_suppress_tokens=None, bad_words_ids=None, no_repeat_ngram_size=None,
                     repetition_penalty=None)


def hf_greedy(model, ids: list[int], new: int, eos=None):
    """``(tokens, scores)``: transformers' greedy tokens after ``ids`` (prompt included, up to
    ``new`` more, stopping at ``eos``) and, per new token, the logits it was picked from."""
    import torch

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False, eos_token_id=eos,
                             pad_token_id=0, output_scores=True, return_dict_in_generate=True, **NO_PROCESSORS)
    return out.sequences[0].tolist(), [s[0].numpy() for s in out.scores]


@dataclass
class Generated:
    """One prompt through the runner one way, beside the reference."""

    prompt: list[int]
    use_prefill: bool
    got: list[int]
    want: list[int]
    #: the largest |runner logit - transformers score| over the new tokens (0.0 when none)
    logit_diff: float
    #: the runner's logits, one array per new token
    logits: list

    @property
    def first_difference(self) -> int | None:
        """Index (among the new tokens) of the first token that differs; None when all agree."""
        if self.got == self.want:
            return None
        return next((i for i, (a, b) in enumerate(zip(self.got, self.want)) if a != b),
                    min(len(self.got), len(self.want))) - len(self.prompt)

    def describe(self, label: str = "") -> str:
        return (f"{label} prompt {self.prompt} prefill={self.use_prefill}: {self.got[len(self.prompt):]} vs "
                f"{self.want[len(self.prompt):]}, logits differ by {self.logit_diff:.3g}").lstrip()


def compare(runner, model, prompts, new: int, refs=None):
    """Yield a :class:`Generated` per prompt and way (prefill model, then decode steps only):
    ``runner``'s ``new`` greedy tokens (no EOS) against ``model``'s (``refs``: the
    :func:`hf_greedy` result of each prompt, computed here when None)."""
    import numpy as np

    for i, ids in enumerate(prompts):
        want, scores = refs[i] if refs is not None else hf_greedy(model, ids, new)
        for use_prefill in (True, False):
            got, logits = runner.generate(ids, new, eos_token_ids=[], return_logits=True, use_prefill=use_prefill)
            diff = max((float(np.abs(g - s).max()) for g, s in zip(logits, scores)), default=0.0)
            yield Generated(list(ids), use_prefill, got, want, diff, logits)


def assert_generates_like_transformers(runner, model, prompts, new: int, logit_tol: float | None = 1e-4,
                                       label: str = "") -> None:
    """Every prompt, both ways: the runner's tokens equal transformers' and (unless
    ``logit_tol`` is None) its logits are within ``logit_tol`` of transformers' scores."""
    for g in compare(runner, model, prompts, new):
        assert g.got == g.want, g.describe(label)
        assert logit_tol is None or g.logit_diff < logit_tol, g.describe(label)
