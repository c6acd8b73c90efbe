"""Which Circle op form a constant-weight ``linear`` becomes: the one onert runs fastest.

The numbers behind the constants are in ``docs/onert-findings.md`` ("Linear forms"), made by
``benchmarks/onert_matmul_forms.py`` (one linear, ``x [1, S, in]``, three forms, interleaved):

- FULLY_CONNECTED: onert 0.1.0's kernel is single-threaded; BATCH_MATMUL with the weight
  pre-transposed runs at the same speed (within noise) for S > 1.
- CONV_2D (1x1, input ``[1, S, 1, in]``, filter ``[out, 1, 1, in]`` = torch's weight as is,
  explicit zero bias) is the only multithreaded matmul kernel: with a second core free it is
  1.5-1.8x faster once there are enough rows, but it pays a fixed cost (two RESHAPEs, thread
  start-up), so for few rows it is slower than FULLY_CONNECTED (1.3-1.5x at S = 1 for
  768 x 768 .. 2048 x 768), and when the other core is busy it is at best even -- except
  for very wide weights (the LM head), where it wins at every row count.

Dynamic row counts keep FULLY_CONNECTED: it is correct for any row count, and the case
that varies at run time (decoding one token) is exactly the one CONV_2D loses.

Weights held once. onert's CONV_2D keeps a private transposed copy of a constant filter (made
when the session is prepared) and frees the file's bytes only when no other op reads that buffer;
FULLY_CONNECTED and BATCH_MATMUL read the buffer as it is (``docs/probes/linear_weight_copies.py``:
a 64 MiB weight read by FC and CONV_2D is held 129 MiB, by two CONV_2Ds 129 MiB, by FC alone 64).
So where entry points share their weights (``Program.shared_weights``: export_llm's one-file
package, prefill and decode over the same buffers) every linear is FULLY_CONNECTED: SmolLM2-135M
float32's runner peaked at weights + 729 MiB with prefill's CONV_2Ds and a CONV_2D LM head in both
entry points, at weights + 99 MiB all FULLY_CONNECTED, prefill not slower with no core free
(``benchmarks/llm_weight_copies.py``; CONV_2D's second thread gains only on an idle core).

A node may force its form with ``node.meta[LINEAR_FORM]`` (:mod:`circle_fx.meta`) (one of :data:`FORMS`),
which tests and ``benchmarks/onert_speed.py`` use. A linear whose weight is quantized
(``node.meta[QUANT_META]``) keeps FULLY_CONNECTED. Its per-row-count choice is the
weight's *encoding*, made by the quantize pass (``QuantConfig.blocks_from_rows``: int8 rows at
few rows, Q8_0 blocks from 16 rows): ``benchmarks/onert_prefill_forms.py`` measured every form
onert runs for a quantized weight (hybrid int8 FC, ggml Q8_0/Q4_0 FC, DEQUANTIZE -> FC,
DEQUANTIZE -> CONV_2D) at 1, 16 and 128 rows, and dequantizing to reach the multithreaded
CONV_2D never won (the per-call dequantization costs more than the product).

Also measured for prefill and not chosen (docs/onert-findings.md, "What bounds prefill"):
BATCH_MATMUL with a constant weight (the FC's single-threaded Eigen GEMM), the 1x1 CONV_2D
with the rows along W (``[1, 1, S, in]``: the same Eigen contraction), the hybrid int8
CONV_2D (2-3x the hybrid FC's CPU) and onert's ``ruy`` backend for FULLY_CONNECTED / CONV_2D
(14-17x the CPU: the wheel's ruy runs its portable C++ path; its AVX kernels are empty).
"""
from __future__ import annotations

from ..meta import LINEAR_FORM

FULLY_CONNECTED = "fully_connected"
CONV_2D = "conv_2d"
BATCH_MATMUL = "batch_matmul"
FORMS = (FULLY_CONNECTED, CONV_2D, BATCH_MATMUL)

#: meta key that forces the form of one linear node
META_KEY = LINEAR_FORM

#: CONV_2D from this many rows (tokens) up (docs/onert-findings.md "Linear forms": whole
#: 125M model at S = 128 0.67x with a free core; one linear at S <= 16 1.3-2x slower)
CONV_MIN_ROWS = 32
#: ... when the product is big enough to amortise its fixed cost: rows x in x out MACs
CONV_MIN_MACS = 32 * 768 * 768
#: A weight this wide (a vocabulary projection) is faster as CONV_2D at any row count:
#: 768 x 32000 at S = 1..32 ran at 0.36-0.91x FULLY_CONNECTED's time in every sweep, even
#: with no core free (FULLY_CONNECTED streams the whole weight once per few rows).
CONV_MIN_OUT_FEATURES = 16384


def choose(rows: int | None, in_features: int, out_features: int, shared: bool = False) -> str:
    """The form for a linear with ``rows`` rows (None: dynamic) and an ``[out, in]`` weight;
    ``shared``: other entry points of the file read the same weight (see "Weights held once")."""
    if rows is None or shared:
        return FULLY_CONNECTED
    if out_features >= CONV_MIN_OUT_FEATURES:
        return CONV_2D
    if rows >= CONV_MIN_ROWS and rows * in_features * out_features >= CONV_MIN_MACS:
        return CONV_2D
    return FULLY_CONNECTED
