"""A quantization report on the calibrated model: the widest activation ranges and the linears
whose quantization error is largest, so a bad scheme is visible before deployment.

    prepared = prepare_pt2e(gm, CircleQuantizer()); [prepared(*b) for b in calibration]
    print(quantization_report(prepared, calibration[:2]))   # before convert_pt2e

Per linear, the SQNR against float: ``10 log10(sum y^2 / sum (y - y_q)^2)`` with ``y`` the float
linear of the float input and weight, and ``y_q`` the same linear of the fake-quantized input
and weight (the observers' parameters), its output fake-quantized when it is observed. Local
to the layer (the float input is the one the prepared model computes there), so the layer that
loses the most stands out; one extra pass over the given batches, observers left untouched.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.fx as fx

aten = torch.ops.aten


@dataclass
class LayerError:
    name: str
    sqnr_db: float


@dataclass
class ObservedRange:
    name: str
    low: float
    high: float

    @property
    def width(self) -> float:
        return self.high - self.low


@dataclass
class QuantizationReport:
    ranges: list[ObservedRange] = field(default_factory=list)
    layers: list[LayerError] = field(default_factory=list)

    def lines(self, top: int = 5) -> list[str]:
        out = ["widest calibrated activation ranges:"]
        out += [f"  {r.name}: [{r.low:.4g}, {r.high:.4g}]" for r in sorted(self.ranges, key=lambda r: -r.width)[:top]]
        out.append("linears with the lowest SQNR against float (dB, on the given batches):")
        out += [f"  {e.name}: {e.sqnr_db:.1f}" for e in sorted(self.layers, key=lambda e: e.sqnr_db)[:top]]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _observer(gm, n):
    if isinstance(n, fx.Node) and n.op == "call_module":
        m = gm.get_submodule(n.target)
        if hasattr(m, "calculate_qparams") and hasattr(m, "quant_min"):
            return m
    return None


def _fake_quant(obs, v):
    scale, zp = obs.calculate_qparams()
    if scale.numel() > 1:
        return torch.fake_quantize_per_channel_affine(v, scale.float(), zp.int(), obs.ch_axis, obs.quant_min,
                                                      obs.quant_max)
    return torch.fake_quantize_per_tensor_affine(v, float(scale), int(zp), obs.quant_min, obs.quant_max)


def _name(n: fx.Node) -> str:
    stack = n.meta.get("nn_module_stack") or {}
    paths = [v[0] for v in stack.values() if isinstance(v, tuple) and v]
    return paths[-1] if paths else n.name


def quantization_report(prepared: fx.GraphModule, batches) -> QuantizationReport:
    """The report of a ``prepare_pt2e``-ed model whose observers have seen the calibration
    data; ``batches`` (input tuples) drive the SQNR measurement."""
    report = QuantizationReport()
    for n in prepared.graph.nodes:
        obs = _observer(prepared, n)
        src = n.args[0] if n.args else None
        if obs is None or not isinstance(src, fx.Node) or src.op == "get_attr" or obs.min_val.numel() != 1:
            continue
        if torch.isfinite(obs.min_val) and torch.isfinite(obs.max_val):
            where = _name(src)
            name = src.name if where == src.name else f"{src.name} ({where})"
            report.ranges.append(ObservedRange(name, float(obs.min_val), float(obs.max_val)))
    linears = {}
    for n in prepared.graph.nodes:
        if n.op == "call_function" and n.target is aten.linear.default:
            ox, ow = _observer(prepared, n.args[0]), _observer(prepared, n.args[1])
            if ox is not None and ow is not None:
                outs = [_observer(prepared, u) for u in n.users]
                linears[n] = (ox, ow, next((o for o in outs if o is not None), None))
    sums = {n: [0.0, 0.0] for n in linears}

    class Measure(fx.Interpreter):
        def call_module(self, target, args, kwargs):
            if _observer(prepared, self._node) is not None:
                return args[0]  # observers pass their input through; never update them here
            return super().call_module(target, args, kwargs)

        def run_node(self, n):
            self._node = n
            out = super().run_node(n)
            if n in linears:
                ox, ow, oy = linears[n]
                x, w = self.env[n.args[0]], self.env[n.args[1]]
                b = self.env[n.args[2]] if len(n.args) > 2 and isinstance(n.args[2], fx.Node) else None
                yq = torch.nn.functional.linear(_fake_quant(ox, x), _fake_quant(ow, w), b)
                if oy is not None:
                    yq = _fake_quant(oy, yq)
                sums[n][0] += float(out.double().pow(2).sum())
                sums[n][1] += float((out.double() - yq.double()).pow(2).sum())
            return out

    with torch.no_grad():
        for batch in batches:
            Measure(prepared).run(*(batch if isinstance(batch, (tuple, list)) else (batch,)))
    for n, (sig, noise) in sums.items():
        report.layers.append(LayerError(_name(n), math.inf if noise == 0 else 10 * math.log10(max(sig, 1e-30) / noise)))
    return report
