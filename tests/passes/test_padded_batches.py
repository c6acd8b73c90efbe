"""Padded batches and the multi-index rewrite behind them.

A causal LM called with a 2-D ``attention_mask`` builds its mask as
``attention_mask[batch_idx, kv_idx]``: indexing with two index tensors, GATHER_ND in
Circle, which onert 0.1.0 lacks. ``circle_fx.passes.flat_index`` rewrites every
multi-tensor ``index.Tensor`` into one GATHER on a flattened index. These tests run the
models in onert (batch 3, lengths 8/5/2, left and right padding, and a different mask at
run time than at export) and compare with eager on the unpadded positions.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import circle_fx

from families import DECODER, SEED, VOCAB
from onert_eager import Fn, assert_onert_matches_eager

S = 8
LENGTHS = (8, 5, 2)
LMS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    dict(head_dim=16, sliding_window=4, layer_types=["sliding_attention", "full_attention"])),
    # eager attention (additive float mask, attention sinks) and an MoE with the default experts
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16, sliding_window=4,
                     max_position_embeddings=131072)),
}


def padding_mask(lengths, side: str) -> torch.Tensor:
    mask = torch.zeros(len(lengths), S, dtype=torch.long)
    for b, n in enumerate(lengths):
        if side == "left":
            mask[b, S - n:] = 1
        else:
            mask[b, :n] = 1
    return mask


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("family", list(LMS))
def test_padded_batch_matches_eager_on_unpadded_positions(family, side):
    config_cls, model_cls, overrides = LMS[family]
    torch.manual_seed(SEED)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**{**DECODER, **overrides})).eval()
    ids = torch.randint(3, VOCAB, (len(LENGTHS), S), generator=torch.Generator().manual_seed(SEED))
    mask = padding_mask(LENGTHS, side)

    cm = circle_fx.export(model, (ids,), example_kwargs={"attention_mask": mask, "use_cache": False})
    hist = cm.op_histogram()
    assert "GATHER_ND" not in hist and hist["GATHER"] >= 2, cm.summary()  # embedding + the mask gather

    # the mask is a run-time input: another padding pattern than the one exported with
    for m in (mask, padding_mask((3, 8, 6), side)):
        with torch.no_grad():
            ref = model(ids, attention_mask=m, use_cache=False).logits.numpy()
        out = cm.run(ids, m)[0]
        keep = m.bool().numpy()
        assert np.isfinite(out[keep]).all()
        np.testing.assert_allclose(out[keep], ref[keep], rtol=1e-4, atol=1e-5)
        assert float(np.abs(ref[keep]).max()) > 1e-2


# ----------------------------------------------------------------- the rewrite, op level

X = torch.randn(4, 5, 6, 3)


@pytest.mark.parametrize("name,fn,n_inputs", [
    ("two adjacent leading", lambda x, i, j: x[i, j], 2),
    ("adjacent, not leading", lambda x, i, j: x[:, i, j], 2),
    ("three index tensors", lambda x, i, j: x[i, j, i], 2),
    ("non-adjacent (index dims go first)", lambda x, i, j: x[i, :, j], 2),
    ("broadcast index shapes", lambda x, i, j: x[i[:, None], j[None, :]], 2),
    ("negative run-time indices", lambda x, i, j: x[-1 - i, -1 - j], 2),
])
def test_run_time_multi_index_is_a_flat_gather(name, fn, n_inputs):
    i = torch.tensor([[0, 3], [2, 1]])
    j = torch.tensor([[4, 0], [1, 2]])
    cm = assert_onert_matches_eager(Fn(fn), (X, i, j), rtol=0, atol=0)
    assert "GATHER_ND" not in cm.op_histogram() and cm.op_histogram()["GATHER"] == 1, name


def test_constant_multi_index_folds_to_one_constant_index():
    rows = torch.tensor([3, 0, -2])  # negative: counted from the end, as torch does
    cols = torch.tensor([[1], [4]])
    cm = assert_onert_matches_eager(Fn(lambda x: x[rows, cols] * 2), (X,), rtol=0, atol=0)
    hist = cm.op_histogram()
    assert hist["GATHER"] == 1 and not any(hist[op] for op in ("LESS", "CAST", "ADD")), hist


def test_boolean_table_gathers_through_int32():
    """onert's GATHER has no bool kernel: the mask case gathers a bool tensor."""
    idx = torch.tensor([[0, 2], [1, 1]])
    cm = assert_onert_matches_eager(Fn(lambda m, i: m[i, 2 - i]), (torch.rand(3, 3) > 0.5, idx),
                                    rtol=0, atol=0)
    assert cm.op_histogram()["GATHER"] == 1
