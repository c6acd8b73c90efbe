"""Sampling with transformers' semantics: the same processed scores as transformers' logits
processors, the same seeded choices, and in onert the same sampled tokens as
``torch.manual_seed(s); model.generate(do_sample=True, ...)``."""
from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (LogitsProcessorList, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from circle_fx import InputError, export_llm
from circle_fx.llm.sampling import Chooser, Sampling
from llm_models import tiny

SETTINGS = [
    dict(temperature=0.7),
    dict(top_k=5),
    dict(top_p=0.8),
    dict(temperature=1.3, top_k=40, top_p=0.9, repetition_penalty=1.2),
    dict(repetition_penalty=0.8, top_p=0.5),
]


def _transformers_processors(s: dict) -> LogitsProcessorList:
    """The list ``model.generate(do_sample=True, ...)`` builds for these settings (same order)."""
    procs = LogitsProcessorList()
    if s.get("repetition_penalty") is not None:
        procs.append(RepetitionPenaltyLogitsProcessor(s["repetition_penalty"]))
    if s.get("temperature") is not None:
        procs.append(TemperatureLogitsWarper(s["temperature"]))
    if s.get("top_k") is not None:
        procs.append(TopKLogitsWarper(s["top_k"]))
    if s.get("top_p") is not None:
        procs.append(TopPLogitsWarper(s["top_p"]))
    return procs


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_same_scores_and_choices_as_transformers_processors(settings):
    gen = torch.Generator().manual_seed(1)
    steps = [torch.randn(1, 96, generator=gen) * 3 for _ in range(40)]
    ids = [3, 7, 7, 11]
    ours = Chooser(Sampling.make(seed=123, **settings))
    procs = _transformers_processors(settings)
    torch.manual_seed(123)  # transformers samples from the global generator
    for logits in steps:
        want_scores = procs(torch.tensor([ids]), logits.clone())
        got_scores = ours.process(logits.numpy()[0], ids)
        assert torch.equal(got_scores, want_scores)
        want = int(torch.multinomial(torch.softmax(want_scores, dim=-1), num_samples=1))
        got = ours(logits.numpy()[0], ids)
        assert got == want
        ids.append(got)
    assert len(set(ids[4:])) > 3  # really sampled: not one token over and over


@pytest.fixture(scope="module")
def model_and_runner(tmp_path_factory):
    model = tiny("llama")
    runner = export_llm(model, max_seq_len=40, prefill_len=8, tokenizer=None).runner(
        str(tmp_path_factory.mktemp("sampling")))
    return model, runner


@pytest.mark.parametrize("settings", SETTINGS[1:4], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_sampled_generation_matches_model_generate(model_and_runner, settings):
    model, runner = model_and_runner
    prompt = [5, 9, 2, 17]
    hf = dict(settings)
    hf.setdefault("top_k", 0)  # transformers' default is top_k=50; ours is no filter unless asked
    for seed in (0, 7):
        torch.manual_seed(seed)
        with torch.no_grad():
            want = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=True, eos_token_id=None,
                                  **hf)[0].tolist()
        assert runner.generate(prompt, 24, eos_token_ids=[], seed=seed, **settings) == want
    assert runner.generate(prompt, 24, eos_token_ids=[], seed=0, **settings) != \
        runner.generate(prompt, 24, eos_token_ids=[], seed=7, **settings)


def test_greedy_stays_default_and_takes_the_repetition_penalty(model_and_runner):
    model, runner = model_and_runner
    prompt = torch.tensor([[5, 9, 2, 17]])
    with torch.no_grad():
        greedy = model.generate(prompt, max_new_tokens=24, do_sample=False, eos_token_id=None)[0].tolist()
        penalised = model.generate(prompt, max_new_tokens=24, do_sample=False, eos_token_id=None,
                                   repetition_penalty=1.5)[0].tolist()
    assert runner.generate(prompt, 24, eos_token_ids=[]) == greedy
    assert runner.generate(prompt, 24, eos_token_ids=[], seed=3) == greedy  # a seed alone does not sample
    assert runner.generate(prompt, 24, eos_token_ids=[], repetition_penalty=1.5) == penalised != greedy


@pytest.mark.parametrize("bad, message", [(dict(temperature=0), "temperature must be"),
                                          (dict(top_k=0), "top_k must be"), (dict(top_p=1.5), "top_p must be"),
                                          (dict(repetition_penalty=-1), "repetition_penalty must be"),
                                          (dict(seed="x"), "seed must be")])
def test_bad_settings_are_input_errors(model_and_runner, bad, message):
    with pytest.raises(InputError, match=message):
        model_and_runner[1].generate([1, 2], 4, **bad)
