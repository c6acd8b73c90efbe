"""``CircleQuantizer``'s scheme options on small models: what the default annotates (linears,
not the residual add), ``skip`` globs, the observers, and bad option values."""
from __future__ import annotations

import pytest
import torch

from circle_fx.errors import InputError
from pt2e_util import LinearNormModel, quantize_pt2e

from circle_fx.quant import CircleQuantizer  # noqa: E402  (pt2e_util skips without torchao)


def _q_outputs(gm) -> list[str]:
    """Targets of the ops whose result is quantized (feeds a quantize node)."""
    return sorted(str(n.args[0].target) for n in gm.graph.nodes
                  if n.op == "call_function" and "quantize_per_tensor" in str(n.target)
                  and "dequantize" not in str(n.target) and n.args[0].op == "call_function")


def _converted(**kwargs):
    torch.manual_seed(0)
    model, x = LinearNormModel(), torch.randn(2, 4, 16)
    return quantize_pt2e(model, (x,), [(torch.randn(2, 4, 16),) for _ in range(3)], CircleQuantizer(**kwargs)), x


def test_default_quantizes_linears_not_the_residual_add():
    c, _ = _converted()
    reads = _q_outputs(c)
    # the norm's last mul is quantized only as the input of fc2; the residual add is not
    assert reads == ["aten.linear.default", "aten.linear.default", "aten.mul.Tensor"], reads


def test_elementwise_option_quantizes_the_add():
    c, _ = _converted(quantize_elementwise=True)
    assert "aten.add.Tensor" in _q_outputs(c), _q_outputs(c)


def test_skip_keeps_the_matching_linear_float():
    every = _converted(skip=())[0]
    c, _ = _converted(skip=("fc2",))
    assert _q_outputs(every).count("aten.linear.default") == 2
    assert _q_outputs(c).count("aten.linear.default") == 1


@pytest.mark.parametrize("observer", ["minmax", "percentile", "mse"])
def test_observers_give_a_model_close_to_float(observer):
    c, x = _converted(activation_observer=observer)
    torch.manual_seed(0)
    ref = LinearNormModel()(x)
    err = (c(x) - ref).abs().max().item()
    assert err < 0.1 * ref.abs().max().item(), err


def test_percentile_observer_clips_a_rare_outlier():
    from circle_fx.quant.pt2e import PercentileObserver

    obs = PercentileObserver(percentile=99.9, dtype=torch.uint8, quant_min=0, quant_max=255)
    x = torch.linspace(-1, 1, 10000)
    x[0] = 1000.0
    obs(x)
    assert obs.max_val.item() < 2.0 and obs.min_val.item() < -0.9


def test_unknown_observer_is_an_input_error():
    with pytest.raises(InputError, match="activation_observer='median'.*'minmax'"):
        CircleQuantizer(activation_observer="median")


@pytest.mark.parametrize("per_channel", [False, True])
def test_float_linear_outputs_quantize_inputs_only_and_run_in_onert(per_channel):
    """``linear_outputs="float"``: the linears' inputs and weights are uint8, their outputs are
    not re-quantized (W8A8 with a float accumulator output), so onert runs each quantized linear
    as a float island (DEQUANTIZE -> float FULLY_CONNECTED) and computes the fake-quant model."""
    import circle_fx
    from pt2e_util import ops_named, read

    c, x = _converted(linear_outputs="float", per_channel_weights=per_channel)
    assert "aten.linear.default" not in _q_outputs(c), _q_outputs(c)
    reads = [n for n in c.graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.linear.default
             and "dequantize" in str(n.args[0].target)]
    assert len(reads) == 2  # both linears still read a uint8-quantized input
    cm = circle_fx.export(c, (x,), quant_target="onert")
    cf = read(cm)
    assert all(cf.tensors[fc.outputs[0]].quantization is None for fc in ops_named(cf, "FULLY_CONNECTED"))
    (y,) = cm.run(x)
    ref = c(x).detach().numpy()
    assert abs(y - ref).max() < 1e-4 * max(1.0, abs(ref).max()), abs(y - ref).max()


def test_unknown_linear_outputs_is_an_input_error():
    with pytest.raises(InputError, match="linear_outputs='int8'.*'quantized', 'float'"):
        CircleQuantizer(linear_outputs="int8")
