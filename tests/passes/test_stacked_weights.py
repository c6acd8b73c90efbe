"""merge_linears stacks weights lazily: no concatenated copy in memory, the writer streams the parts."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

import circle_fx
from circle_fx.circle.reader import read_circle
from circle_fx.emit.builder import Stacked
from circle_fx.program import StackedTensor


class QKV(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(64, 64, bias=False), nn.Linear(64, 32, bias=False), nn.Linear(64, 32, bias=False)

    def forward(self, x):
        return self.q(x).sum(-1) + self.k(x).sum(-1) * self.v(x).sum(-1)


def test_merged_weight_is_streamed_from_the_model_weights(tmp_path):
    model, x = QKV().eval(), torch.randn(1, 40, 64)
    program = circle_fx.capture(model, (x,))
    cm = circle_fx.lower(program)
    stacked = [b for b in cm.builder.buffers if isinstance(b, Stacked)]
    assert len(stacked) == 1 and stacked[0].shape == (128, 64)
    for part, w in zip(stacked[0].parts, (model.q.weight, model.k.weight, model.v.weight)):
        assert np.shares_memory(part, w.detach().numpy())  # views of the model's weights, no copy
    cf = read_circle(cm.save(tmp_path / "m.circle"))
    want = torch.cat([model.q.weight, model.k.weight, model.v.weight]).detach().numpy()
    assert any(b.size == want.nbytes and np.array_equal(b.data.view(np.float32).reshape(want.shape), want)
               for b in cf.buffers)  # the file holds the stacked bytes
    assert np.array_equal(np.frombuffer(cm.to_bytes(), np.uint8), np.fromfile(tmp_path / "m.circle", np.uint8))
    (got,) = cm.run(x)
    with torch.no_grad():
        assert np.abs(got - model(x).numpy()).max() < 1e-4


def test_stacked_tensor_acts_as_the_concatenation():
    parts = [torch.randn(3, 4), torch.randn(2, 4)]
    t = StackedTensor(parts)
    full = torch.cat(parts)
    assert t.shape == (5, 4) and t.dtype == torch.float32
    assert torch.equal(t @ torch.ones(4), full @ torch.ones(4))  # any op sees the concatenation
    assert torch.equal(t.abs().amax(1), full.abs().amax(1))
    kept = t.detach().reshape(5, 1, 1, 4)  # what the CONV_2D lowering does: still parts, no copy
    assert isinstance(kept, StackedTensor) and kept.parts[0].data_ptr() == parts[0].data_ptr()
    assert torch.equal(kept.materialize(), full.reshape(5, 1, 1, 4))
