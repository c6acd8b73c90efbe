"""Does onert 0.1.0 apply a FULLY_CONNECTED's fused activation (RELU, RELU6) correctly, for each
kernel circle_fx emits a linear with? (issue 21 item 3: fuse Linear + ReLU/ReLU6 only where it is
exact.)

For each encoding of one linear ``x [rows, in] -> [rows, out]`` (float; int8 weights: hybrid FC
-> MUL by the row scales -> ADD bias; GGML Q8_0 / Q4_0: FC -> ADD bias; PT2E uint8: uint8 FC),
circle_fx exports the linear *without* an activation; this script then sets
``fused_activation_function`` on one operator of the file (``on``: the FULLY_CONNECTED itself,
or the last operator of the chain, the one writing the result) and runs both files in onert.
The fused file must equal the activation applied to the unfused file's output, bit for bit:

- float outputs: ``relu(y)`` / ``min(max(y, 0), 6)`` of the unfused onert output (atol 0);
- uint8 outputs (PT2E, read back through DEQUANTIZE): the unfused quantized output clamped to
  ``[zp, zp + round(6 / s)]`` (what TFLite's quantized kernels compute for RELU / RELU6).

Activation on the FC of a chain that goes on (MUL, ADD) is not the linear's activation unless
the rest is positive scaling: those rows say whether the *kernel* honours the flag, the
``last`` rows whether the fused chain is exact. Columns: mismatching elements / total, the max
|difference|, and the fraction of outputs the activation changes (so 0 mismatches is not an
activation that never fired).

    PYTHONPATH=$PWD python benchmarks/onert_fc_activation.py
"""
from __future__ import annotations

import os
import sys
import tempfile
import warnings

import flatbuffers
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import circle_fx  # noqa: E402
from circle_fx.circle.runtime import OnertSession  # noqa: E402
from circle_schema.v0_10.circle.Model import ModelT  # noqa: E402
from circle_schema.v0_10.circle.BuiltinOperator import BuiltinOperator as BO  # noqa: E402

RELU, RELU6 = 1, 3  # circle.ActivationFunctionType
ROWS, IN, OUT = 4, 64, 48


class Linear(torch.nn.Module):
    def __init__(self, bias: bool):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(IN, OUT, bias=bias)
        with torch.no_grad():
            self.fc.weight.mul_(8)  # outputs well past 6 and below 0: both bounds fire

    def forward(self, x):
        return self.fc(x)


def _inputs(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(ROWS, IN, generator=g) for _ in range(n)]


def export(route: str, bias: bool):
    model = Linear(bias).eval()
    xs = _inputs(4, 0)
    if route == "uint8":
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        from circle_fx.quant.pt2e import CircleQuantizer

        gm = torch.export.export(model, (xs[0],)).module()
        prepared = prepare_pt2e(gm, CircleQuantizer(skip=()))
        with torch.no_grad():
            for x in _inputs(8, 1):
                prepared(x)
        return circle_fx.export(convert_pt2e(prepared), (xs[0],), quant_target="onert", verbose=False), xs
    quant = {"float": None, "int8": "int8-weights", "q8_0": "q8_0", "q4_0": "q4_0"}[route]
    return circle_fx.export(model, (xs[0],), quantize=quant, verbose=False), xs


def _codes(m: ModelT):
    return [c.builtinCode if c.builtinCode else c.deprecatedBuiltinCode for c in m.operatorCodes]


def fused_bytes(data: bytes, on: str, act: int) -> tuple[bytes, str, object]:
    """``data`` with ``act`` (0: none) set on the FULLY_CONNECTED (``on="fc"``: the graph then
    ends at the FC and returns its own result, so the kernel is probed alone) or on the operator whose result
    the graph returns (through a final DEQUANTIZE / RESHAPE); that op's name and, for a quantized
    result, its output tensor's quantization."""
    m = ModelT.InitFromPackedBuf(bytearray(data), 0)
    sg, codes = m.subgraphs[0], _codes(m)
    names = {v: k for k, v in vars(BO).items() if not k.startswith("_")}
    writer = {o: op for op in sg.operators for o in op.outputs}
    if on == "fc":
        op = next(op for op in sg.operators if codes[op.opcodeIndex] == BO.FULLY_CONNECTED)
        if sg.tensors[op.outputs[0]].type == sg.tensors[sg.outputs[0]].type:
            for sig in m.signatureDefs or ():  # onert returns the signature's tensor
                for o in sig.outputs:
                    if o.tensorIndex == sg.outputs[0]:
                        o.tensorIndex = op.outputs[0]
            sg.outputs = [op.outputs[0]]
            sg.operators = sg.operators[:sg.operators.index(op) + 1]  # the chain after it removed
    else:
        op = writer[sg.outputs[0]]
        while codes[op.opcodeIndex] in (BO.DEQUANTIZE, BO.RESHAPE):
            op = writer[op.inputs[0]]
    op.builtinOptions.fusedActivationFunction = act
    q = sg.tensors[op.outputs[0]].quantization
    fb = flatbuffers.Builder(0)
    fb.Finish(m.Pack(fb), file_identifier=b"CIR0")
    return bytes(fb.Output()), names[codes[op.opcodeIndex]], q


def run(data: bytes, xs) -> list[np.ndarray]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.circle")
        with open(path, "wb") as f:
            f.write(data)
        s = OnertSession(path, verified=True)
        return [s.run([x.numpy()])[0] for x in xs]


def expected(y: np.ndarray, act: int, q) -> np.ndarray:
    if q is None or not q.scale:
        return np.maximum(y, np.float32(0)) if act == RELU else np.minimum(np.maximum(y, np.float32(0)), np.float32(6))
    s, zp = q.scale[0], q.zeroPoint[0]
    qy = np.round(y / np.float32(s)).astype(np.int64) + zp  # the dequantized output back to its steps
    hi = 255 if act == RELU else min(255, zp + int(round(6 / s)))
    return ((np.clip(qy, zp, hi) - zp) * np.float32(s)).astype(np.float32)


def main() -> None:
    warnings.simplefilter("ignore")
    print("| encoding | bias | activation on | op | act | mismatches | max abs diff | changed by act |")
    print("|---|---|---|---|---|---|---|---|")
    for route in ("float", "int8", "q8_0", "q4_0", "uint8"):
        for bias in (True, False):
            cm, xs = export(route, bias)
            for on in ("fc", "last"):
                base_bytes, base_op, _ = fused_bytes(cm.to_bytes(), on, 0)
                if (on == "last") == (base_op == "FULLY_CONNECTED" and route != "uint8") or \
                        (on == "fc" and route == "uint8"):
                    continue  # the FC is the last op (uint8: read through its DEQUANTIZE): one probe
                base = run(base_bytes, xs)
                for act, act_name in ((RELU, "RELU"), (RELU6, "RELU6")):
                    data, op_name, q = fused_bytes(cm.to_bytes(), on, act)
                    got = run(data, xs)
                    want = [expected(y, act, q) for y in base]
                    bad = sum(int((g != w).sum()) for g, w in zip(got, want))
                    diff = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
                    changed = sum(int((w != y).sum()) for w, y in zip(want, base)) / sum(y.size for y in base)
                    total = sum(y.size for y in base)
                    print(f"| {route} | {bias} | {on} | {op_name} | {act_name} | {bad}/{total} | {diff:.3g} | "
                          f"{changed:.0%} |", flush=True)


if __name__ == "__main__":
    main()
