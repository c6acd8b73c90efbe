"""State beyond K/V: export_llm carries each layer's named state tensors (conv windows, SSM /
linear-attention states) as model inputs and outputs, driven through transformers' own cache
calls (``get_conv_state``/``update_conv_state``/``update_recurrent_state``) on
``circle_fx.llm.cache.GraphCache``, no patching. The manifest names each state and how the
host carries it (``carry``: written at the position, or replaced each step); ``LLMRunner``
follows it. Each family generates transformers' exact greedy tokens in onert, for a prompt
shorter than ``prefill_len`` (decode steps: a padded prefill would leave the state after the
padding) and a longer one (prefill, then decode steps), and picks them from the same logits."""
from __future__ import annotations

import os
import sys

import pytest
import torch

import circle_fx
from llm_models import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import hf_families as hf  # noqa: E402
from greedy_reference import assert_generates_like_transformers, hf_greedy  # noqa: E402

PROMPTS = ([5, 17, 9], [5, 17, 9, 33, 42, 100, 7])  # shorter and longer than P
NEW, S, P = 6, 16, 4


def _build(family, cls):
    model = hf.build(family, cls)
    model.config.use_cache = True
    model.generation_config.use_cache = True
    return model


def _generates_like_transformers(family: str, cls: str, tmp_path):
    model = _build(family, cls)
    pkg = circle_fx.export_llm(model, max_seq_len=S, prefill_len=P, tokenizer=None)
    pkg.save(tmp_path)
    assert_generates_like_transformers(pkg.runner(), model, PROMPTS, NEW, logit_tol=1e-4, label=family)
    return model, pkg.manifest


def test_graph_cache_carries_lfm2_conv_state_like_transformers():
    """Eager, no export: the prefill and decode wrappers (GraphCache answering the model's own
    conv-state calls) give transformers' logits step by step, and record a conv window per
    conv layer beside the attention layer's K/V."""
    from circle_fx.llm.cache import DecodeStep, Prefill, probe_caches
    from circle_fx.llm.export import model_spec

    model = tiny("lfm2")
    model.generation_config.use_cache = True
    spec = model_spec(model, S, P)
    spec.caches = probe_caches(model, spec)
    kinds = {(c.kind, c.carry) for c in spec.caches}
    assert kinds == {("conv", "replace"), ("key", "position"), ("value", "position")}, kinds
    conv = next(c for c in spec.caches if c.kind == "conv")
    assert conv.shape == (1, model.config.hidden_size, model.config.conv_L_cache) and conv.name == "conv_cache_0"
    ids = PROMPTS[1]
    want, scores = hf_greedy(model, ids, NEW)
    state = {c.key: torch.zeros(c.shape) for c in spec.caches}
    with torch.no_grad():
        out = Prefill(model, spec)(torch.tensor([ids[:P]], dtype=torch.int32), torch.tensor([P - 1], dtype=torch.int32))
        step = DecodeStep(model, spec)
        for c in spec.caches:
            state[c.key] = out[c.output] if c.carry == "replace" else state[c.key].index_copy(
                2, torch.arange(P), out[c.output])
        seq = list(ids)
        for p in range(P, len(ids) + NEW - 1):
            token = seq[p] if p < len(ids) else int(logits.argmax())
            if p >= len(ids):
                seq.append(token)
            out = step(torch.tensor([[token]], dtype=torch.int32), torch.tensor([p], dtype=torch.int32),
                       [state[c.key] for c in spec.caches])
            logits = out["logits"].reshape(-1)
            if p >= len(ids) - 1:
                assert torch.allclose(logits, torch.from_numpy(scores[p - len(ids) + 1]), atol=1e-5), p
            for c in spec.caches:
                state[c.key] = out[c.output] if c.carry == "replace" else state[c.key].index_copy(
                    2, torch.tensor([p]), out[c.output])


@pytest.mark.slow
def test_lfm2_short_conv_generates_exactly(tmp_path):
    model, m = _generates_like_transformers("lfm2", "Lfm2ForCausalLM", tmp_path)
    states = {s["name"]: s for s in m["cache"]["states"]}
    assert states["conv_cache_0"]["carry"] == "replace" and states["key_cache_1"]["carry"] == "position"
    assert states["conv_cache_0"]["shape"] == [1, model.config.hidden_size, model.config.conv_L_cache]
    assert m["prefill"]["pads"] is False and m["cache"]["shape"] is None


@pytest.mark.slow
def test_falcon_h1_mamba2_ssm_state_generates_exactly(tmp_path):
    """Falcon-H1: attention and a Mamba-2 mixer in every layer: K/V plus a conv window and an
    SSM state per layer, all carried through onert."""
    _, m = _generates_like_transformers("falcon_h1", "FalconH1ForCausalLM", tmp_path)
    kinds = {s["kind"]: s["carry"] for s in m["cache"]["states"]}
    assert kinds == {"key": "position", "value": "position", "conv": "replace", "recurrent": "replace"}, kinds
