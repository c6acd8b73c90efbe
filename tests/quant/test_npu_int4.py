"""4-bit weights for the npu target (``CircleQuantizer(activation_dtype="int16", weight_bits=4)``).

The file: FULLY_CONNECTED int16 x INT4 -> int16, the weight packed two per byte (TFLite's
layout: element ``2i`` in the low nibble), one scale per output row; ``verify`` accepts it, the
reader unpacks the same integers ``convert_pt2e`` produced, and the numpy reference
(``circle_fx.circle.reference``; onert 0.1.0 rejects INT4) reproduces the fake-quantized model
within one output step. GPTQ (``gptq=True``) must lower a linear's output error below
round-to-nearest's on correlated inputs. Perplexity on SmolLM2-135M is measured in
``benchmarks/npu_int16_accuracy.py --only int4``.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx.circle import int4, reference
from circle_fx.circle.inspect import format_circle
from circle_fx.circle.schema import TT
from circle_fx.errors import InputError
from circle_fx.quant import CircleQuantizer
from circle_fx.quant.gptq import Hessian, gptq, symmetric_grid
from pt2e_util import LinearNormModel, ops_named, output_scale, quantize_pt2e, read


def test_pack_layout_and_round_trip():
    # element 0 in the low nibble of byte 0, element 1 in its high nibble; -2 is 0xE
    assert int4.pack(np.array([1, -2]), TT.INT4).tolist() == [0xE1]
    assert int4.pack(np.array([15, 0, 3]), TT.UINT4).tolist() == [0x0F, 0x03]  # odd: high nibble 0
    rng = np.random.default_rng(0)
    for shape in ([3, 5], [4, 8], [7]):
        v = rng.integers(-8, 8, shape).astype(np.int8)
        packed = int4.pack(v)
        assert packed.size == int4.nbytes(shape)
        np.testing.assert_array_equal(int4.unpack(packed.tobytes(), shape), v)
        u = rng.integers(0, 16, shape).astype(np.uint8)
        np.testing.assert_array_equal(int4.unpack(int4.pack(u, TT.UINT4), shape, TT.UINT4), u)
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        int4.pack(np.array([8]))


def _calibration(shape, n=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=g) * 2,) for _ in range(n)]


def _per_tensor_4bit_spec():
    """A user's own spec: int8 values in [-8, 7], one scale per tensor (also stored as INT4)."""
    from torchao.quantization.pt2e.observer import MinMaxObserver
    from torchao.quantization.pt2e.quantizer import QuantizationSpec

    return QuantizationSpec(dtype=torch.int8, quant_min=-8, quant_max=7, qscheme=torch.per_tensor_symmetric,
                            observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=2 ** -12))


@pytest.mark.parametrize("mode", ["rtn", "gptq", "per_tensor_spec"])
def test_int4_file_round_trips_and_matches_fake_quant(mode):
    torch.manual_seed(0)
    model, x = LinearNormModel(), torch.randn(2, 4, 16) * 2
    calib = _calibration(x.shape) + [(x,)]
    use_gptq = mode == "gptq"
    q = CircleQuantizer(activation_dtype="int16", weight=_per_tensor_4bit_spec()) if mode == "per_tensor_spec" else \
        CircleQuantizer(activation_dtype="int16", weight_bits=4, gptq=use_gptq, calibration=calib if use_gptq else None)
    c = quantize_pt2e(model, (x,), calib, q)
    cm = circle_fx.export(c, (x,), quant_target="npu")
    data = cm.to_bytes()
    circle_fx.verify(data)
    cf = read(cm)
    fcs = ops_named(cf, "FULLY_CONNECTED")
    assert len(fcs) == 2 and len(q.gptq_scales) == (2 if use_gptq else 0)
    # the converted graph's integer weights, as PT2E produced them: [out, in] int8 in [-8, 7]
    ints = sorted((t for t in c.state_dict().values() if t.dtype == torch.int8 and t.dim() == 2),
                  key=lambda t: -t.shape[0])
    for fc, want in zip(sorted(fcs, key=lambda op: -cf.tensors[op.inputs[1]].shape[0]), ints):
        w = cf.tensors[fc.inputs[1]]
        assert [cf.tensors[i].type_name for i in fc.inputs] == ["INT16", "INT4", "INT64"]
        assert cf.buffers[w.buffer].size == int4.nbytes(w.shape)  # two per byte
        rows = 1 if mode == "per_tensor_spec" else w.shape[0]
        assert len(w.quantization.scale) == rows and set(w.quantization.zero_point) == {0}
        got = cf.tensor_data(fc.inputs[1])
        assert got.dtype == np.int8 and got.min() >= -8 and got.max() <= 7
        np.testing.assert_array_equal(got, want.numpy())
    (out,) = reference.run(data, [x.numpy()])
    steps = np.abs(out - c(x).detach().numpy()).max() / output_scale(cf)
    assert steps <= 1.0 + 1e-3, steps
    assert "INT4" in cm.weight_bytes_by_dtype()
    n4 = sum(t.type == TT.INT4 for t in cf.tensors)  # the user's per-tensor spec makes the norm's gamma 4-bit too
    assert n4 == (3 if mode == "per_tensor_spec" else 2)
    assert f"4-bit weights: {n4} tensors (INT4, two elements per byte" in format_circle(cf)


def test_verify_names_an_unpacked_int4_buffer():
    import flatbuffers
    from circle_schema import circle

    torch.manual_seed(0)
    model, x = LinearNormModel(), torch.randn(2, 4, 16)
    c = quantize_pt2e(model, (x,), _calibration(x.shape), CircleQuantizer(activation_dtype="int16", weight_bits=4))
    m = circle.Model.ModelT.InitFromPackedBuf(bytearray(circle_fx.export(c, (x,), quant_target="npu").to_bytes()), 0)
    sg = m.subgraphs[0]
    w = next(t for t in sg.tensors if t.type == TT.INT4)
    m.buffers[w.buffer].data = np.zeros(int(np.prod(w.shape)), np.uint8)  # one element per byte: wrong
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"CIR0")
    with pytest.raises(circle_fx.VerifyError, match=r"INT4 needs \d+ \(two 4-bit elements per byte\)"):
        circle_fx.verify(bytes(b.Output()))


def test_gptq_beats_round_to_nearest_on_correlated_inputs():
    g = torch.Generator().manual_seed(0)
    mix = torch.randn(32, 32, generator=g)
    x = torch.randn(512, 32, generator=g) @ mix  # correlated input columns
    w = torch.randn(24, 32, generator=g)
    h = Hessian(32)
    h.add(x)
    grid, chosen = symmetric_grid(-8, 7, search=False)
    rtn_grid = grid(w)
    rtn = torch.stack([rtn_grid(c, k) for k, c in enumerate(w.T)], 1)
    gq_grid, gq_chosen = symmetric_grid(-8, 7, search=False)
    q = gptq(w, h.h, gq_grid)
    scale = gq_chosen["groups"][0]
    ints = q / scale[:, None]
    assert torch.allclose(ints, ints.round(), atol=1e-4) and ints.min() >= -8 - 1e-4 and ints.max() <= 7 + 1e-4  # on the grid
    err = lambda wq: ((x @ (w - wq).T) ** 2).sum().item()  # noqa: E731
    assert err(q) < 0.7 * err(rtn), (err(q), err(rtn))


def test_int4_options_are_checked():
    with pytest.raises(InputError, match="activation_dtype='int16'"):
        CircleQuantizer(weight_bits=4)
    with pytest.raises(InputError, match="weight_bits=4 and calibration"):
        CircleQuantizer(activation_dtype="int16", weight_bits=4, gptq=True)
    with pytest.raises(InputError, match="weight_bits=3"):
        CircleQuantizer(activation_dtype="int16", weight_bits=3)


def test_rotation_keeps_the_float_model_and_flattens_its_norms(tiny_llama):
    """``rotate_residual`` (QuaRot/SpinQuant's R1): same logits, every gamma folded (ones),
    an orthogonal R; a model without Llama's module names is refused."""
    import copy

    from circle_fx.quant.rotation import rotate_residual

    model, (ids,) = tiny_llama
    rotated = copy.deepcopy(model)
    with torch.no_grad():
        want = model(ids).logits
        r = rotate_residual(rotated)
        got = rotated(ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(r @ r.T, torch.eye(r.shape[0], dtype=r.dtype), atol=1e-10, rtol=0)
    norms = [m.weight for n, m in rotated.named_modules() if n.endswith("norm")]
    assert norms and all(bool((w == 1).all()) for w in norms)
    assert not torch.equal(rotated.model.embed_tokens.weight, model.model.embed_tokens.weight)
    with pytest.raises(InputError, match="Llama-style"):
        rotate_residual(torch.nn.Linear(4, 4))
