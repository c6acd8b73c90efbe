"""Probe (docs/onert-findings.md, "Ranks above 4"): LOGICAL_OR / LOGICAL_AND of bool inputs in
onert 0.1.0 against numpy, at ranks 2..6, with operands that broadcast (size-1 dims on both sides,
a lower-rank operand) and with operands of the output's shape.
Run: PYTHONPATH=. python docs/probes/logical_broadcast.py  (prints wrong elements / all elements)"""
import os
import tempfile

import numpy as np
import onert

from circle_fx.circle.schema import BO, TT
from circle_fx.emit.builder import ModelBuilder
from circle_fx.emit.writer import serialize


def wrong(code, sa, sb, seed=0):
    so = list(np.broadcast_shapes(tuple(sa), tuple(sb)))
    mb = ModelBuilder()
    a, b, o = mb.add_tensor("a", sa, TT.BOOL), mb.add_tensor("b", sb, TT.BOOL), mb.add_tensor("o", so, TT.BOOL)
    mb.add_operator(code, [a, b], [o])
    mb.inputs, mb.input_names, mb.outputs, mb.output_names = [a, b], ["a", "b"], [o], ["o"]
    path = os.path.join(tempfile.mkdtemp(), "m.circle")
    with open(path, "wb") as f:
        f.write(bytes(serialize(mb).head))
    r = np.random.default_rng(seed)
    x, y = r.random(sa) > 0.5, r.random(sb) > 0.5
    got, = onert.infer.session(path).infer([x, y])
    want = (np.logical_or if code == BO.LOGICAL_OR else np.logical_and)(x, y)
    return f"{int((np.asarray(got) != want).sum())}/{want.size}"


CASES = {2: ([2, 1], [1, 3]), 3: ([2, 1, 4], [1, 3, 1]), 4: ([2, 1, 3, 4], [1, 3, 1, 4]),
         5: ([2, 1, 3, 1, 4], [1, 3, 1, 2, 1]), 6: ([2, 1, 3, 1, 2, 4], [1, 3, 1, 2, 1, 1])}

if __name__ == "__main__":
    for name, code in (("LOGICAL_OR", BO.LOGICAL_OR), ("LOGICAL_AND", BO.LOGICAL_AND)):
        for rank, (sa, sb) in CASES.items():
            full = list(np.broadcast_shapes(tuple(sa), tuple(sb)))
            print(f"{name} rank {rank}: broadcast {sa} x {sb}: {wrong(code, sa, sb)} wrong; "
                  f"lower-rank {full} x {sb[-2:]}: {wrong(code, full, sb[-2:])}; "
                  f"same shape {full}: {wrong(code, full, full)}")
