"""No partial output, ever, and no changes to the user's model.

- ``export`` leaves every parameter and buffer bit-identical, and every module's
  ``training`` flag as it was (including submodules the user put in eval mode);
- a failed export writes no file;
- ``save`` writes a temp file and renames it: a failure mid-write leaves neither a
  partial model nor a temp file, and an existing file is kept intact.
"""
from __future__ import annotations

import gc
import glob
import os
import tempfile

import numpy as np
import pytest
import torch
from torch import nn

import circle_fx
from circle_fx import CircleFxError
from circle_fx.emit.writer import Serialized


class GemmaNorm(nn.Module):
    """``x * (1 + w)``: constant folding must create a new tensor, not update ``w``."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d) * 0.1)

    def forward(self, x):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * (1.0 + self.weight)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.lin = nn.Linear(8, 8)
        self.norm = GemmaNorm(8)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight  # tied weights
        self.register_buffer("offset", torch.arange(8, dtype=torch.float32) / 8)

    def forward(self, ids):
        h = self.drop(self.lin(self.emb(ids) + self.offset))
        return self.head(self.norm(h))


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(2))
        self.l = nn.Linear(2, 2)

    def forward(self, x):
        self.count.add_(1)  # rejected: Circle models are stateless
        return self.l(x) + self.count


def snapshot(model: nn.Module):
    state = {k: (v.dtype, tuple(v.shape), v.detach().clone().numpy().tobytes()) for k, v in model.state_dict().items()}
    params = {k: (id(p), p.requires_grad) for k, p in model.named_parameters()}
    flags = {name: m.training for name, m in model.named_modules()}
    return state, params, flags


def assert_unchanged(model, before):
    state, params, flags = snapshot(model)
    assert state.keys() == before[0].keys()
    for k in state:
        assert state[k] == before[0][k], f"state_dict[{k!r}] changed"
    assert params == before[1], "parameters were replaced or their requires_grad changed"
    assert flags == before[2], "training flags changed"


@pytest.mark.parametrize("mode", ["train", "eval", "mixed"])
def test_export_leaves_the_model_untouched(mode):
    torch.manual_seed(0)
    model = Model()
    model.train(mode != "eval")
    if mode == "mixed":
        model.norm.eval()  # a frozen submodule inside a training model
    ids = torch.randint(0, 16, (2, 5))
    before = snapshot(model)
    cm = circle_fx.export(model, (ids,))
    assert_unchanged(model, before)
    # and the export is of the eval-mode model (dropout off)
    model.eval()
    with torch.no_grad():
        ref = model(ids).numpy()
    np.testing.assert_allclose(cm.run(ids)[0], ref, rtol=1e-4, atol=1e-4)


def test_failed_export_leaves_the_model_untouched():
    model = Counter().train()
    before = snapshot(model)
    with pytest.raises(CircleFxError):
        circle_fx.export(model, (torch.randn(3, 2),))
    assert_unchanged(model, before)


def test_failed_export_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CircleFxError):
        circle_fx.export(Counter(), (torch.randn(3, 2),))

    class Unsupported(nn.Module):
        def forward(self, x):
            return torch.cumprod(x, 0)

    with pytest.raises(CircleFxError):
        circle_fx.export(Unsupported(), (torch.randn(3, 2),))
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def small():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    return circle_fx.export(model, (torch.randn(3, 4),))


class _Boom(Exception):
    pass


def _failing_serialized(good: Serialized) -> Serialized:
    class Failing(Serialized):
        def write_to(self, f):
            f.write(bytes(self.head[: len(self.head) // 2]))  # half a model, then a crash
            raise _Boom("disk full")

    return Failing(good.head, good.segments)


def test_save_is_atomic_on_failure(small, tmp_path):
    path = tmp_path / "m.circle"
    broken = circle_fx.CircleModel(small.builder, _failing_serialized(small.serialized), small.report)
    with pytest.raises(_Boom):
        broken.save(path)
    assert list(tmp_path.iterdir()) == []  # no partial file, no temp file

    small.save(path)
    good = path.read_bytes()
    with pytest.raises(_Boom):
        broken.save(path)
    assert path.read_bytes() == good  # the previous model survives
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.circle"]


def test_save_roundtrip(small, tmp_path):
    path = small.save(tmp_path / "m.circle")
    assert open(path, "rb").read() == small.to_bytes()
    assert circle_fx.verify(path).operators == len(small.builder.operators)


def test_run_cleans_up_its_temp_file():
    model = nn.Sequential(nn.Linear(4, 2)).eval()
    cm = circle_fx.export(model, (torch.randn(1, 4),))
    cm.run(torch.randn(1, 4))
    path = cm._session_path
    assert path and os.path.exists(path)
    del cm
    gc.collect()
    assert not os.path.exists(path)


def test_exported_weights_are_independent_of_later_model_edits():
    """The file content is fixed at export time, even if the user keeps training."""
    model = nn.Sequential(nn.Linear(4, 2)).eval()
    x = torch.randn(1, 4)
    cm = circle_fx.export(model, (x,))
    before = cm.to_bytes()
    expected = model(x).detach().numpy()
    with torch.no_grad():
        model[0].weight.add_(1.0)
    assert cm.to_bytes() == before
    np.testing.assert_allclose(cm.run(x)[0], expected, rtol=1e-5, atol=1e-5)


def test_no_stray_tmp_files_left_next_to_saved_models(small, tmp_path):
    for i in range(3):
        small.save(tmp_path / f"m{i}.circle")
    assert not glob.glob(str(tmp_path / "*.tmp-*"))
