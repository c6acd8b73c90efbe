"""Weight-only int8 convolutions (``quantize="int8-weights"`` on a CNN).

Every convolution weight becomes int8 with one scale per output channel (``circle.conv2d_w8``)
and a hybrid CONV_2D / DEPTHWISE_CONV_2D in the file. Two error sources are bounded
separately, as for the linears (tests/quant/test_quant_weights.py): the FX graph after the
quantize pass (dequantized weights, eager) against the float model is the weight rounding;
onert against that graph is the hybrid kernel, which quantizes its input map to int8 at run
time. The accuracy of whole models on a fixed input set is benchmarks/cnn_quant_accuracy.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import circle_fx
from circle_fx import QuantConfig
from circle_fx.circle.reader import read_circle


class _Convs(nn.Module):
    """Every convolution form the lowering takes: plain with stride/padding, Conv+BN+ReLU
    (folded and fused first), depthwise with a channel multiplier, grouped, dilated, 1-D."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.dw = nn.Conv2d(16, 32, 3, padding=1, groups=16, bias=False)
        self.grouped = nn.Conv2d(32, 24, 3, padding=2, dilation=2, groups=2)
        self.c1 = nn.Conv1d(24, 8, 3, padding=1)
        # channel magnitudes 0.05 .. 2: one per-tensor scale would flatten the small channels
        with torch.no_grad():
            for conv in (self.stem, self.dw, self.grouped):
                conv.weight.mul_(torch.linspace(0.05, 2.0, conv.weight.shape[0]).reshape(-1, 1, 1, 1))
            self.bn.running_mean.normal_(0, 0.1)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        y = torch.relu(self.bn(self.stem(x)))
        y = nn.functional.relu6(self.dw(y))
        y = self.grouped(y)
        return self.c1(y.mean(2))


def _rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_int8_convolutions_per_channel_in_onert():
    torch.manual_seed(0)
    model = _Convs().eval()
    x = torch.randn(1, 3, 16, 16)
    program = circle_fx.capture(model, (x,))
    cm = circle_fx.api.lower(program, quantize="int8-weights")
    with torch.no_grad():
        ref = model(x).numpy()
    graph = program.run(x)[0].numpy()
    got = cm.run(x)[0]
    assert _rel(graph, ref) <= 0.01, _rel(graph, ref)  # weight rounding only
    assert _rel(got, graph) <= 0.02, _rel(got, graph)  # the hybrid kernels' input quantization
    assert _rel(got, ref) <= 0.03
    cf = read_circle(cm.to_bytes())
    convs = [op for op in cf.operators if op.name in ("CONV_2D", "DEPTHWISE_CONV_2D")]
    assert {op.name for op in convs} == {"CONV_2D", "DEPTHWISE_CONV_2D"}
    assert len(convs) == 1 + 1 + 2 + 1  # the grouped conv is one CONV_2D per group
    for op in convs:
        w = cf.tensors[op.inputs[1]]
        assert w.type_name == "INT8" and cf.tensors[op.inputs[0]].type_name == "FLOAT32"
        q = w.quantization
        out_channels = w.shape[3] if op.name == "DEPTHWISE_CONV_2D" else w.shape[0]
        assert q.per_channel and len(q.scale) == out_channels and set(q.zero_point) == {0}
        assert q.axis == (3 if op.name == "DEPTHWISE_CONV_2D" else 0)
    hist = cm.op_histogram()
    assert "RELU" not in hist and "MAXIMUM" not in hist  # Conv+BN+ReLU and the ReLU6 still fused
    assert "DEQUANTIZE" not in hist and "MUL" not in hist  # per-channel scales in the kernel itself
    # named after their parameters, also the BatchNorm-folded stem and the 1-D conv's 4-D weight
    assert sorted(q[0] for q in cm.report.quantization.quantized if q[1] == "conv") == \
        ["c1.weight", "dw.weight", "grouped.weight", "stem.weight"]


def test_int8_convolutions_at_batch_three_run_per_sample(tmp_path):
    """onert 0.1.0's hybrid convolutions kill the process at batch > 1 (SIGSEGV / SIGABRT): each
    sample goes through its own hybrid CONV_2D (one int8 filter, SPLIT + CONCATENATION). Run in a
    child process, so a crash is this test's failure rather than the suite's."""
    import subprocess
    import sys

    torch.manual_seed(0)
    model = _Convs().eval()
    x = torch.randn(3, 3, 16, 16)
    cm = circle_fx.export(model, (x,), quantize="int8-weights", verbose=False)
    path, xin, out = tmp_path / "b3.circle", tmp_path / "x.npy", tmp_path / "y.npy"
    cm.save(str(path))
    np.save(xin, x.numpy())
    child = (f"from circle_fx import CircleModel; import numpy as np; "
             f"np.save({str(out)!r}, CircleModel.load({str(path)!r}).run(np.load({str(xin)!r}))[0])")
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    with torch.no_grad():
        ref = model(x).numpy()
    assert _rel(np.load(out), ref) <= 0.03
    for b in range(3):  # each sample as accurate as alone
        assert _rel(np.load(out)[b], ref[b]) <= 0.03
    cf = read_circle(cm.to_bytes())
    convs = [op for op in cf.operators if op.name in ("CONV_2D", "DEPTHWISE_CONV_2D")]
    assert len(convs) == 3 * 5
    # one int8 filter buffer per convolution weight (group), shared by the three samples
    assert len({cf.tensors[op.inputs[1]].buffer for op in convs}) == 5


def test_conv_weights_follow_skip_and_weights_none():
    torch.manual_seed(0)
    model = _Convs().eval()
    x = torch.randn(1, 3, 16, 16)
    cm = circle_fx.export(model, (x,), quantize=QuantConfig(skip=("stem*", "dw*")), verbose=False)
    kept = dict(cm.report.quantization.skipped)
    assert set(kept) == {"stem.weight", "dw.weight"} and "skip pattern" in kept["dw.weight"], kept
    cf = read_circle(cm.to_bytes())
    types = sorted(cf.tensors[op.inputs[1]].type_name for op in cf.operators if op.name.endswith("CONV_2D"))
    assert types == ["FLOAT32", "FLOAT32", "INT8", "INT8", "INT8"]
    with torch.no_grad():
        assert _rel(cm.run(x)[0], model(x).numpy()) <= 0.03


def test_conv_weights_follow_overrides_as_linears_do():
    """``QuantConfig.overrides`` decide a convolution's mode as they decide a linear's: an override
    to None keeps it float and counts as a match (it used to be reported as ``weights=None`` and
    then refused as a pattern matching nothing); a GGML mode becomes int8 per channel."""
    torch.manual_seed(0)
    model = _Convs().eval()
    x = torch.randn(1, 3, 16, 16)
    cm = circle_fx.export(model, (x,), quantize=QuantConfig(overrides={"stem*": None, "dw*": "q8_0"}), verbose=False)
    record = cm.report.quantization
    assert dict(record.skipped) == {"stem.weight": "override 'stem*' keeps it float"}, record.skipped
    assert record.overridden == {"stem*": ["stem.weight"], "dw*": ["dw.weight"]}
    assert [n for n, _ in record.fallbacks] == ["dw.weight"] and "q8_0 -> int8 per channel" in record.fallbacks[0][1]
    assert sorted(q[0] for q in record.quantized) == ["c1.weight", "dw.weight", "grouped.weight"]


def _tiny_resnet():
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    model = ResNetForImageClassification(ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16],
                                                      depths=[1, 1], layer_type="basic", num_labels=10))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1, generator=g)
                m.running_var.uniform_(0.5, 1.5, generator=g)
    return model.eval()


@pytest.mark.slow
def test_tiny_resnet_int8_weights_in_onert():
    """transformers' ResNet: every convolution int8 per channel; onert's logits against eager
    float and against the int8 graph on a few fixed images."""
    model = _tiny_resnet()
    xs = torch.randn(4, 1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    program = circle_fx.capture(model, (xs[0],), example_kwargs={"return_dict": False})
    cm = circle_fx.api.lower(program, quantize="int8-weights")
    record = cm.report.quantization
    # stem, two convolutions per stage, the second stage's downsampling shortcut
    assert sum(1 for q in record.quantized if q[1] == "conv") == 6 and not record.skipped
    for x in xs:
        with torch.no_grad():
            ref = model(x, return_dict=False)[0].numpy()
        graph = program.run(x)[0].numpy()
        got = cm.run(x)[0]
        assert _rel(graph, ref) <= 0.02 and _rel(got, graph) <= 0.03 and _rel(got, ref) <= 0.04, \
            (_rel(graph, ref), _rel(got, graph))


# ------------------------------------------------------------------ PT2E (static uint8)

class _Block(nn.Module):
    """MobileNetV2's and ResNet's convolution forms: TF-style zero pad + strided depthwise +
    ReLU6, a 1x1 conv, a residual add, Conv + BatchNorm + ReLU, a grouped conv."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, stride=2, groups=8)
        self.pw = nn.Conv2d(8, 8, 1)
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        with torch.no_grad():
            self.bn.running_mean.normal_(0, 0.1)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        y = torch.relu(self.bn(self.stem(x)))
        y = nn.functional.relu6(self.dw(nn.functional.pad(y, [0, 1, 0, 1])))
        y = self.pw(y) + y
        return self.grouped(y)


@pytest.mark.slow
def test_pt2e_convolutions_are_uint8_and_match_fake_quant():
    """CircleQuantizer quantizes convolutions (uint8 x uint8 per tensor, the form onert 0.1.0
    computes right): every convolution but the stem's (its input is the model input's layout
    permute, not a dequantize) is an integer CONV_2D / DEPTHWISE_CONV_2D with the ReLU / ReLU6
    fused and the zero pad folded in, and the file is within one output step of the fake-quantized model in onert."""
    from pt2e_util import quantize_pt2e

    torch.manual_seed(0)
    model = _Block().eval()
    x = torch.randn(1, 3, 16, 16)
    calib = [(torch.randn(1, 3, 16, 16),) for _ in range(4)]
    fake = quantize_pt2e(model, (x,), calib, circle_fx.quant.CircleQuantizer())
    cm = circle_fx.export(fake, (x,), quant_target="onert", verbose=False)
    with torch.no_grad():
        want = fake(x).numpy()
    got = cm.run(x)[0]
    step = np.diff(np.unique(want)).min()  # the output's quantization step
    # within one step: onert requantizes with TFLite's double rounding (as its FULLY_CONNECTED,
    # docs/onert-findings.md), so a value near a half step may land one step away
    assert np.abs(got - want).max() <= 1.001 * step and np.mean(got != want) < 0.1
    cf = read_circle(cm.to_bytes())
    convs = [op for op in cf.operators if op.name in ("CONV_2D", "DEPTHWISE_CONV_2D")]
    kinds = sorted((op.name, cf.tensors[op.inputs[0]].type_name, cf.tensors[op.inputs[1]].type_name) for op in convs)
    assert kinds == [("CONV_2D", "FLOAT32", "FLOAT32")] + [("CONV_2D", "UINT8", "UINT8")] * 3 + \
        [("DEPTHWISE_CONV_2D", "UINT8", "UINT8")], kinds
    for op in convs:
        if cf.tensors[op.inputs[1]].type_name == "UINT8":
            bias = cf.tensors[op.inputs[2]]
            assert bias.type_name == "INT32" and not cf.tensors[op.inputs[1]].quantization.per_channel
    hist = cm.op_histogram()
    assert not {"PAD", "PADV2", "RELU", "MAXIMUM", "MINIMUM"} & set(hist), hist
    # the float stem is named in summary(), with why
    (note,) = [n for n in cm.report.notes if "convolution(s) stay float32" in n]
    assert note.startswith("quant_target='onert': 1 convolution(s)") and "its input is not dequantized" in note
    assert "self.stem(x)" in note, note
    with torch.no_grad():
        assert _rel(cm.run(x)[0], model(x).numpy()) <= 0.05


class _Block1d(nn.Module):
    """A speech front end's shape: 1-D convolutions with ReLUs, depthwise, a 1x1 projection."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv1d(8, 16, 5, padding=2)
        self.dw = nn.Conv1d(16, 16, 3, padding=1, groups=16)
        self.proj = nn.Conv1d(16, 4, 1)

    def forward(self, x):
        return self.proj(torch.relu(self.dw(torch.relu(self.stem(x)))))


def test_pt2e_1d_convolutions_are_uint8_and_match_fake_quant():
    """A 1-D convolution runs as a 2-D one over a unit height, so its operands reach it through
    a reshape: ``unsqueeze(DQ(q))`` and ``Q(squeeze(conv))``. The reshapes move to the integer
    side of the per-tensor Q/DQ (and a folded weight's reshape keeps its quantization record),
    so every convolution but the stem (the float input's layout permute) is a uint8 one."""
    from pt2e_util import quantize_pt2e

    torch.manual_seed(0)
    model = _Block1d().eval()
    x = torch.randn(1, 8, 40)
    calib = [(torch.randn(1, 8, 40),) for _ in range(4)]
    fake = quantize_pt2e(model, (x,), calib, circle_fx.quant.CircleQuantizer())
    cm = circle_fx.export(fake, (x,), quant_target="onert", verbose=False)
    with torch.no_grad():
        want = fake(x).numpy()
    got = cm.run(x)[0]
    step = np.diff(np.unique(want)).min()
    assert np.abs(got - want).max() <= 1.001 * step and np.mean(got != want) < 0.1
    cf = read_circle(cm.to_bytes())
    convs = [op for op in cf.operators if op.name in ("CONV_2D", "DEPTHWISE_CONV_2D")]
    kinds = sorted((op.name, cf.tensors[op.inputs[1]].type_name) for op in convs)
    assert kinds == [("CONV_2D", "FLOAT32"), ("CONV_2D", "UINT8"), ("DEPTHWISE_CONV_2D", "UINT8")], kinds
    assert "RELU" not in cm.op_histogram()
