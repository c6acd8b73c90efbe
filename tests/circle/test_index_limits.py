"""Index inputs are safe: the valid range of every integer input feeding a GATHER (and a
dynamic dim's maximum, an LLM's max_seq_len) is in the file's ``circle_fx.limits`` metadata,
``run``/``CircleModel.load``/the runner/``inspect`` read it, out-of-range values are refused
naming the input, and the emitted graph clamps the indices (onert reads outside the table
otherwise)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import circle_fx
from circle_fx import InputError
from circle_fx.circle.reader import read_circle
from circle_fx.cli import main
from circle_fx.llm import LLMRunner
from circle_fx.model import CircleModel
from llm_models import tiny


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(256, 8)
        self.lin = nn.Linear(8, 4)

    def forward(self, ids):
        return self.lin(self.emb(ids))


@pytest.fixture(scope="module")
def embed():
    torch.manual_seed(0)
    model = Embed().eval()
    ids = torch.randint(0, 256, (1, 6), dtype=torch.int32)
    return model, ids


def test_range_is_in_the_file_and_checked_by_run(embed, tmp_path):
    model, ids = embed
    cm = circle_fx.export(model, (ids,))
    path = cm.save(str(tmp_path / "e.circle"))
    assert read_circle(path).limits == {"version": 1, "inputs": {"ids": {"index_range": [0, 255]}}}
    for m in (cm, CircleModel.load(path)):
        bad = np.array([[1, 2, 3, 100000, -1, 5]], np.int32)
        with pytest.raises(InputError, match=r"'ids' has value\(s\) -1, 100000 outside 0..255"):
            m.run(bad)
        (got,) = m.run(ids)
        with torch.no_grad():
            assert np.abs(got - model(ids.long()).numpy()).max() < 1e-5


@pytest.mark.parametrize("clamp", [True, False])
def test_clamped_graph_never_reads_outside_the_table(embed, clamp):
    """Past the run() check (a C++ host): with clamping an id past the table reads the last row."""
    model, ids = embed
    cm = circle_fx.export(model, (ids,), clamp_indices=clamp)
    assert (cm.op_histogram()["MINIMUM"] == 1) is clamp
    cm.builder.index_ranges.clear()  # what a host that ignores the metadata does
    last = np.full((1, 6), 255, np.int32)
    (want,) = cm.run(last)
    (got,) = cm.run(np.full((1, 6), 100000, np.int32))
    if clamp:
        np.testing.assert_array_equal(got, want)
        (neg,) = cm.run(np.full((1, 6), -7, np.int32))
        np.testing.assert_array_equal(neg, cm.run(np.zeros((1, 6), np.int32))[0])


def test_dynamic_dim_maximum_is_in_the_file(tmp_path):
    class Norm(nn.Module):
        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    x = torch.randn(1, 8, 16)
    seq = torch.export.Dim("seq", min=2, max=64)
    cm = circle_fx.export(Norm(), (x,), dynamic_shapes=({1: seq},))
    path = cm.save(str(tmp_path / "d.circle"))
    assert read_circle(path).limits["inputs"]["x"]["max_dims"] == {"1": 64}
    loaded = CircleModel.load(path)
    assert loaded.builder.input_limits == {("x", 1): 64}
    with pytest.raises(InputError, match="at most 64"):
        loaded.run(torch.randn(1, 65, 16))
    (y,) = loaded.run(torch.randn(1, 40, 16))
    assert y.shape == (1, 40, 16)


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    d = tmp_path_factory.mktemp("limits")
    return circle_fx.export_llm(tiny("llama"), max_seq_len=16, prefill_len=4).save(str(d / "pkg"))


def test_llm_files_manifest_runner_and_inspect_carry_the_limits(package, capsys):
    import json
    import os

    manifest = json.load(open(os.path.join(package, "manifest.json")))
    for part, extra in (("decode", {"position": {"index_range": [0, 15]}}),
                        ("prefill", {"last_index": {"index_range": [0, 3]}})):
        # model.circle's limits: each entry point's inputs under the main graph's names (decode.position)
        one = read_circle(os.path.join(package, "model.circle")).limits
        limits = manifest[part]["limits"]
        assert all(one["inputs"][f"{part}.{k}"] == v for k, v in limits["inputs"].items())
        assert limits["max_seq_len"] == one["max_seq_len"] == 16
        assert limits["inputs"]["input_ids"]["index_range"] == [0, 127]
        for name, entry in extra.items():
            assert limits["inputs"][name] == entry
    runner = LLMRunner(package)
    with pytest.raises(InputError, match="'input_ids' has value.*128 outside 0..127"):
        runner.step(128, 0)
    with pytest.raises(InputError, match="outside 0..127"):
        runner.run_prefill([1, 500])
    assert main(["inspect", os.path.join(package, "model.circle"), "--only", "buffers"]) == 0
    out = capsys.readouterr().out
    assert "input_ids values in 0..127" in out and "position values in 0..15" in out and "max_seq_len 16" in out
