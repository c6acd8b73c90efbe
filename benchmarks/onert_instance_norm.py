"""Is onert 0.1.0's INSTANCE_NORM exact enough to carry GroupNorm / LayerNorm? A probe table
(issue 21 item 3: fuse the norms into INSTANCE_NORM only where onert's kernel is exact).

INSTANCE_NORM normalizes a channels-last ``[N, H, W, C]`` tensor per (sample, channel) over
``H x W`` and applies a per-channel gamma / beta. Each row is a one-operator Circle file run
in onert and compared, like circle_fx's own decomposition (MEAN, SUB, MUL, RSQRT in float32,
numpy here), with a float64 reference:

- ``instance``: a plain instance norm (a CNN's per-channel norm).
- ``group``: GroupNorm(G) over ``[N, C, H, W]`` as INSTANCE_NORM on ``[N, 1, H*W*C/G, G]``
  (each group a channel; the per-channel affine of GroupNorm would follow as MUL / ADD).
- ``layer``: LayerNorm over C of ``[B, L, C]`` as INSTANCE_NORM on ``[1, 1, C, B*L]`` (each
  token a channel; needs a transpose in the real graph).

Inputs with a large common offset (mean 100, std 1) show whether the kernel's variance is
computed stably (E[x^2] - E[x]^2 loses everything there in float32).

    python benchmarks/onert_instance_norm.py
"""
import os
import tempfile

import flatbuffers
import numpy as np
from circle_schema.v0_10.circle.Buffer import BufferT
from circle_schema.v0_10.circle.BuiltinOperator import BuiltinOperator as BO
from circle_schema.v0_10.circle.BuiltinOptions import BuiltinOptions as BOpt
from circle_schema.v0_10.circle.InstanceNormOptions import InstanceNormOptionsT
from circle_schema.v0_10.circle.Model import ModelT
from circle_schema.v0_10.circle.Operator import OperatorT
from circle_schema.v0_10.circle.OperatorCode import OperatorCodeT
from circle_schema.v0_10.circle.SubGraph import SubGraphT
from circle_schema.v0_10.circle.Tensor import TensorT
from circle_schema.v0_10.circle.TensorType import TensorType as TT
from onert import infer

EPS = 1e-5


def build(path, shape, gamma, beta):
    m = ModelT()
    m.version = 3
    oc = OperatorCodeT()
    oc.builtinCode = BO.INSTANCE_NORM
    oc.deprecatedBuiltinCode = BO.INSTANCE_NORM  # a negative (Circle-only) code: the same in both fields
    oc.version = 1
    m.operatorCodes = [oc]
    bufs = [BufferT()]
    sg = SubGraphT()
    sg.tensors, sg.operators = [], []

    def tensor(name, shp, data=None):
        t = TensorT()
        t.name, t.shape, t.type, t.buffer = name, list(shp), TT.FLOAT32, 0
        if data is not None:
            b = BufferT()
            b.data = np.frombuffer(np.ascontiguousarray(data, np.float32).tobytes(), np.uint8)
            bufs.append(b)
            t.buffer = len(bufs) - 1
        sg.tensors.append(t)
        return len(sg.tensors) - 1

    x, g, b, y = tensor("x", shape), tensor("g", [shape[-1]], gamma), tensor("b", [shape[-1]], beta), tensor("y", shape)
    op = OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [x, g, b], [y]
    op.builtinOptionsType = BOpt.InstanceNormOptions
    op.builtinOptions = InstanceNormOptionsT()
    op.builtinOptions.epsilon = EPS
    sg.operators.append(op)
    sg.inputs, sg.outputs = [x], [y]
    m.subgraphs, m.buffers = [sg], bufs
    fb = flatbuffers.Builder(0)
    fb.Finish(m.Pack(fb), file_identifier=b"CIR0")
    with open(path, "wb") as fh:
        fh.write(fb.Output())


def norm(x, gamma, beta, dtype):
    """Per (sample, channel) over the middle axes, two passes (as circle_fx decomposes)."""
    x = x.astype(dtype)
    mean = x.mean(axis=(1, 2), keepdims=True, dtype=dtype)
    c = x - mean
    var = (c * c).mean(axis=(1, 2), keepdims=True, dtype=dtype)
    return (c / np.sqrt(var + dtype(EPS))).astype(dtype) * gamma.astype(dtype) + beta.astype(dtype)


def main():
    rng = np.random.default_rng(0)
    tmp = tempfile.mkdtemp()
    cases = {"instance [1, 8, 8, 16]": [1, 8, 8, 16], "group 4 of [2, 16, 8, 8]": [2, 1, 8 * 8 * 4, 4],
             "layer [2, 12, 64]": [1, 1, 64, 24]}
    print("| form | input | onert vs float64 | float32 two-pass vs float64 | note |\n|---|---|---|---|---|")
    for name, shape in cases.items():
        for offset in (0.0, 100.0):
            x = (rng.standard_normal(shape) + offset).astype(np.float32)
            gamma = rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32)
            beta = rng.uniform(-1, 1, shape[-1]).astype(np.float32)
            path = os.path.join(tmp, "in.circle")
            build(path, shape, gamma, beta)
            exact = norm(x, gamma, beta, np.float64)
            ours = np.abs(norm(x, gamma, beta, np.float32) - exact).max()
            try:
                y = infer.session(path, "cpu").infer([x])[0]
                got, note = f"{np.abs(y - exact).max():.2g}", ""
            except Exception as e:  # noqa: BLE001 - a kernel onert lacks is a row too
                got, note = "-", str(e).splitlines()[0][:100]
            print(f"| {name} | mean {offset:g}, std 1 | {got} | {ours:.2g} | {note} |", flush=True)


if __name__ == "__main__":
    main()
