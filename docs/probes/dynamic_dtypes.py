"""Probe (docs/onert-findings.md §4): which dtypes onert 0.1.0 runs for PAD, TILE, CONCATENATION,
STRIDED_SLICE and GATHER on a dynamic [1,-1] input.  Run: PYTHONPATH=. python docs/probes/dynamic_dtypes.py"""
import numpy as np
from circle_fx.emit.builder import ModelBuilder
from circle_fx.emit.writer import serialize
from circle_fx.emit.types import circle_type
from circle_fx.model import CircleModel, ExportReport
from circle_fx.circle.schema import BO, make_options
import torch

def run(op, dt):
    mb = ModelBuilder()
    ct = circle_type(dt)
    x = mb.add_tensor("x", [1, 4], ct, 0, [1, -1])
    npdt = torch.empty(0, dtype=dt).numpy().dtype
    if op == "PAD":
        out = mb.add_tensor("y", [1, 6], ct, 0, [1, -1])
        mb.add_operator(BO.PAD, [x, mb.add_constant("p", np.array([[0, 0], [2, 0]], np.int32))], [out], make_options("PadOptions"))
    elif op == "TILE":
        out = mb.add_tensor("y", [2, 4], ct, 0, [2, -1])
        mb.add_operator(BO.TILE, [x, mb.add_constant("m", np.array([2, 1], np.int32))], [out])
    elif op == "CONCATENATION":
        out = mb.add_tensor("y", [1, 6], ct, 0, [1, -1])
        mb.add_operator(BO.CONCATENATION, [mb.add_constant("z", np.zeros((1, 2), npdt)), x], [out], make_options("ConcatenationOptions", axis=1))
    elif op == "STRIDED_SLICE":
        out = mb.add_tensor("y", [1, 2], ct, 0, [1, -1])
        c = lambda n, v: mb.add_constant(n, np.array(v, np.int32))
        mb.add_operator(BO.STRIDED_SLICE, [x, c("b", [0, 0]), c("e", [0, -2]), c("s", [1, 1])], [out], make_options("StridedSliceOptions", endMask=1))
    elif op == "GATHER":
        out = mb.add_tensor("y", [1, 4], ct, 0, [1, -1])
        mb.add_operator(BO.GATHER, [mb.add_constant("t", np.arange(8).astype(npdt)), x], [out], make_options("GatherOptions", axis=0))
    mb.inputs, mb.outputs, mb.input_names, mb.output_names = [x], [out], ["x"], ["y"]
    cm = CircleModel(mb, serialize(mb), ExportReport())
    arr = (np.arange(7) % 5).astype(npdt)[None]
    try:
        (got,) = cm.run(arr)
        return f"ok {got.tolist()}"
    except Exception as e:
        return "FAIL " + str(e.__cause__.__cause__ if e.__cause__ and e.__cause__.__cause__ else e)[:80]

for op in ("PAD", "TILE", "CONCATENATION", "STRIDED_SLICE", "GATHER"):
    for dt in (torch.float32, torch.int32, torch.int64, torch.bool):
        if op == "GATHER" and dt not in (torch.int32, torch.int64): continue
        print(op, dt, run(op, dt))
