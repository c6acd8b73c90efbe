"""Speech models from tiny random configs: exported, run in onert, compared with eager.

Wav2Vec2's feature encoder is a stack of strided conv1d with a GroupNorm over every channel
(group_norm's decomposition) and GELU; its positional embedding a grouped, padded conv1d.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import circle_fx


@pytest.mark.slow  # ~8 s idle, ~25 s on a loaded machine (transformers import + export)
def test_wav2vec2_for_ctc_matches_eager():
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    config = Wav2Vec2Config(vocab_size=32, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=64, conv_dim=(16, 16, 16), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
                            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
    torch.manual_seed(0)
    model = Wav2Vec2ForCTC(config).eval()
    audio = torch.randn(1, 400, generator=torch.Generator().manual_seed(1))
    cm = circle_fx.export(model, (audio,))
    ref = model(audio).logits.detach().numpy()
    assert np.abs(ref).max() > 1e-3
    np.testing.assert_allclose(cm.run(audio)[0], ref, rtol=1e-4, atol=1e-5)
    assert cm.op_histogram()["CONV_2D"] >= 3, cm.op_histogram()
