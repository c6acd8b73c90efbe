"""Encoder families a user hands over as they are, on inputs the table's rows do not use:
a batch of several sequences, several languages picked at run time, FNet's Fourier mixing.
Each runs in onert and is compared with eager (float32, rtol=atol=1e-4)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import circle_fx

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=64)


def _ids(batch, seq, seed=0):
    return torch.randint(3, SMALL["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(seed))


def _close(got, want):
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-4, atol=1e-4)


def test_roberta_batch_of_three_without_token_types():
    """The default token types are a gather from a buffer of zeros by run-time positions: at
    batch > 1 that was an int64 one-hot sum onert cannot run (uniform_gather folds it)."""
    torch.manual_seed(0)
    model = transformers.RobertaForMaskedLM(transformers.RobertaConfig(**SMALL)).eval()
    ids = _ids(3, 7)
    cm = circle_fx.export(model, (ids,))
    with torch.no_grad():
        _close(cm.run(ids)[0], model(input_ids=ids).logits)
    assert "SUM" not in cm.op_histogram()


def test_xmod_languages_chosen_at_run_time():
    """X-MOD's per-language adapters (``out[mask] = adapter(h[mask])``): every adapter on every
    row, then a select (masked_rows); a second language assignment runs in the same file."""
    torch.manual_seed(0)
    cfg = transformers.XmodConfig(**SMALL, languages=["en_XX", "de_DE", "fr_XX"], default_language="en_XX")
    model = transformers.XmodForMaskedLM(cfg).eval()
    ids = _ids(3, 6)
    types = torch.zeros_like(ids)
    cm = circle_fx.export(model, (ids,), example_kwargs={"lang_ids": torch.tensor([2, 0, 1]), "token_type_ids": types})
    for langs in ([2, 0, 1], [1, 1, 0]):
        lang = torch.tensor(langs)
        with torch.no_grad():
            want = model(input_ids=ids, lang_ids=lang, token_type_ids=types).logits
        _close(cm.run(ids, lang, types)[0], want)


def test_fnet_fourier_mixing():
    """``torch.fft.fftn(h, dim=(1, 2)).real`` as cosine / sine matrix products (complex_to_real)."""
    torch.manual_seed(0)
    cfg = transformers.FNetConfig(**{k: v for k, v in SMALL.items() if k != "num_attention_heads"})
    model = transformers.FNetForMaskedLM(cfg).eval()
    ids = _ids(2, 8)
    cm = circle_fx.export(model, (ids,))
    with torch.no_grad():
        _close(cm.run(ids)[0], model(input_ids=ids).logits)


def test_detr_with_a_transformers_resnet_backbone():
    """DETR without timm (``use_timm_backbone=False``): its first decoder self-attention reads
    only constants and folds; the cross-attention's queries are then constants too."""
    torch.manual_seed(0)
    backbone = transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                         out_features=["stage4"])
    cfg = transformers.DetrConfig(use_timm_backbone=False, backbone_config=backbone, d_model=32, encoder_layers=1,
                                  decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
                                  encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=10, num_labels=3)
    model = transformers.DetrForObjectDetection(cfg).eval()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    cm = circle_fx.export(model, (x,))
    with torch.no_grad():
        want = model(pixel_values=x)
    got = cm.run(x)
    _close(got[0], want.logits)
    _close(got[1], want.pred_boxes)
