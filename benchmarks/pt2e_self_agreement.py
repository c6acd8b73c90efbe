"""The control for issue 18's agreement gate: torch against torch, no onert.

    python benchmarks/pt2e_self_agreement.py [TOKENS] [SCHEME]     # 128, per-channel-float-out

The fake-quant model (``convert_pt2e`` of SmolLM2-135M with a ``pt2e_localize.SCHEMES`` scheme)
is run as is and again with every ``aten.linear`` summed in float64 and rounded to float32
(the last-bit change a different GEMM summation order makes). Prints the top-1 agreement of the
two torch runs and their perplexities: what the onert file's agreement with its reference should
be compared with.
"""
import os
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore")

import torch  # noqa: E402

import checkpoint as ck  # noqa: E402
import pt2e_accuracy as pa  # noqa: E402
from pt2e_localize import SCHEMES  # noqa: E402

T = int(sys.argv[1]) if len(sys.argv) > 1 else 128
scheme = sys.argv[2] if len(sys.argv) > 2 else "per-channel-float-out"
opts = SCHEMES[scheme]
model = ck.logits_model()
ev, cal = ck.eval_ids(T), ck.calibration_ids(T)
gm = torch.export.export(model, (ev,), strict=False).module()
q = pa.quantize(gm, cal, **opts)
with torch.no_grad():
    fq = q(ev).numpy()


def lin64(x, w, b=None):
    y = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    return y.float()


for n in q.graph.nodes:
    if n.op == "call_function" and n.target is torch.ops.aten.linear.default:
        n.target = lin64
q.recompile()
with torch.no_grad():
    fq64 = q(ev).numpy()
print(f"{scheme} {opts}, {T} tokens: top-1 fake-quant (float64-summed linears) vs fake-quant "
      f"{ck.top1_agreement(fq64, fq):.3f}; ppl {ck.perplexity(fq, ev):.2f} -> {ck.perplexity(fq64, ev):.2f}")
