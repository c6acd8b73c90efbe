"""Can onert's GGML kernels run on this CPU? Asked once per process, in a child process.

onert 0.1.0's pip wheel builds its ggml kernels for AVX-512 (measured 2026-12-04: ``vmovdqu8`` in
``ggml_graph_plan``). On a CPU without it, the first run of a FULLY_CONNECTED with a GGML weight or
a GATHER from a GGML table kills the whole process with SIGILL: no exception, no message. So
before onert loads a model with GGML tensors, a one-operator model (a Q4_0 FULLY_CONNECTED and a
Q4_0 GATHER, 32x32) runs in a child Python; if the child dies, loading the real model raises
:class:`~circle_fx.errors.RuntimeFailure` saying why, instead of crashing the caller.
``CIRCLE_FX_GGML_RUNS=1`` / ``0`` skips the probe (e.g. a host that knows its CPU).
"""
from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from ..errors import RuntimeFailure
from . import ggml
from .reader import read_circle

_CHILD = """
import sys, numpy as np
from onert import infer
s = infer.session(sys.argv[1], "cpu")
y = s.infer([np.ones((1, 32), np.float32), np.zeros((1, 1), np.int32)])
print("ok", float(np.asarray(y[0]).sum()))
"""


def _probe_model() -> bytes:
    """A Circle file: y = FC(x, W) with W a GGML_Q4_0 [32, 32] of ones, and GATHER of row 0 of it."""
    import flatbuffers
    from circle_schema import circle as C

    from .schema import BO, BOPT, TT

    rec = np.zeros(32, ggml.Q4_0.record())
    rec["d"] = 1.0
    rec["q"] = 0x99  # nibbles 9: value (9 - 8) * 1 = 1
    m = C.Model.ModelT()
    m.version = 3
    m.operatorCodes = []
    for code in (BO.FULLY_CONNECTED, BO.GATHER):
        oc = C.OperatorCode.OperatorCodeT()
        oc.builtinCode = oc.deprecatedBuiltinCode = code
        oc.version = 1
        m.operatorCodes.append(oc)
    empty, weights = C.Buffer.BufferT(), C.Buffer.BufferT()
    weights.data = np.frombuffer(rec.tobytes(), np.uint8)
    m.buffers = [empty, weights]
    sg = C.SubGraph.SubGraphT()
    sg.tensors = []
    for name, shape, tt, buf in (("x", [1, 32], TT.FLOAT32, 0), ("w", [32, 32], TT.GGML_Q4_0, 1),
                                 ("y", [1, 32], TT.FLOAT32, 0), ("ids", [1, 1], TT.INT32, 0),
                                 ("rows", [1, 1, 32], TT.FLOAT32, 0)):
        t = C.Tensor.TensorT()
        t.name, t.shape, t.type, t.buffer = name, shape, tt, buf
        sg.tensors.append(t)
    fc = C.Operator.OperatorT()
    fc.opcodeIndex, fc.inputs, fc.outputs = 0, [0, 1, -1], [2]
    fc.builtinOptionsType = BOPT.FullyConnectedOptions
    fc.builtinOptions = C.FullyConnectedOptions.FullyConnectedOptionsT()
    gather = C.Operator.OperatorT()
    gather.opcodeIndex, gather.inputs, gather.outputs = 1, [1, 3], [4]
    gather.builtinOptionsType = BOPT.GatherOptions
    gather.builtinOptions = C.GatherOptions.GatherOptionsT()
    sg.operators, sg.inputs, sg.outputs = [fc, gather], [0, 3], [2, 4]
    m.subgraphs = [sg]
    b = flatbuffers.Builder(0)
    b.Finish(m.Pack(b), file_identifier=b"CIR0")
    return bytes(b.Output())


@functools.lru_cache(maxsize=1)
def ggml_unsupported_reason() -> str | None:
    """None when onert's GGML kernels run here, else why not (probed once per process)."""
    forced = os.environ.get("CIRCLE_FX_GGML_RUNS")
    if forced in ("0", "1"):
        return None if forced == "1" else "CIRCLE_FX_GGML_RUNS=0"
    fd, path = tempfile.mkstemp(suffix=".circle", prefix="circle_fx_ggml_probe_")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_probe_model())
        env = dict(os.environ, USE_MMAPED_DATA="1")
        try:
            r = subprocess.run([sys.executable, "-c", _CHILD, path], capture_output=True, text=True,
                               timeout=120, env=env)
        except subprocess.TimeoutExpired:
            return "a one-operator GGML model did not finish in 120 s in onert"
    finally:
        os.unlink(path)
    if r.returncode == 0 and "ok" in r.stdout:  # what it computed is the tests' business
        return None
    if r.returncode == -signal.SIGILL:
        return ("onert's GGML kernels use instructions this CPU lacks (the pip wheel's ggml is built for "
                "AVX-512; a one-operator GGML model died with SIGILL)")
    tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
    return f"a one-operator GGML model failed in onert (exit {r.returncode}): {' | '.join(tail)}"


def has_block_tensors(path) -> bool:
    """Does any subgraph hold GGML block tensors (an LLM package's entry points are subgraphs 1, 2)?"""
    cf = read_circle(path)
    graphs = [cf] + [read_circle(path, subgraph=k) for k in range(1, cf.num_subgraphs)]
    return any(ggml.block_type(t.type) is not None for g in graphs for t in g.tensors)


def idle_cores(cores: int, loadavg: str) -> int:
    """How many of ``cores`` nothing else is running on, from ``/proc/loadavg``'s text: its
    fourth field ``R/T`` counts the runnable tasks system-wide *now* (this one included), unlike
    the load averages, which lag by a minute. At least 1."""
    try:
        running = int(loadavg.split()[3].split("/")[0])
    except (IndexError, ValueError):
        return 1
    return max(1, min(cores, cores - max(0, running - 1)))


def ggml_thread_count() -> int:
    """Threads for a GGML session prepared now: the cores this process may use that are idle.

    ggml's threads spin-wait for each other, so the right count depends on the host's load at
    the time (measured 2026-12-05, 125M Llama, 2 cores, docs/onert-findings.md): with the other
    core idle, two threads decode Q8_0 1.5x and Q4_0 1.15x faster and prefill 128 tokens
    1.5-1.8x faster than one; with the other core busy, two threads are 2-10x *slower*. Three
    samples a few ms apart, the busiest counts: a momentary idle reading must not buy a session
    that collapses for its whole life."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return 1
    best = cores
    for i in range(3):
        if i:
            time.sleep(0.005)
        try:
            with open("/proc/loadavg") as f:
                best = min(best, idle_cores(cores, f.read()))
        except OSError:
            return 1
    return best


@contextlib.contextmanager
def ggml_threads(active: bool):
    """``NUM_THREADS`` = :func:`ggml_thread_count` while onert prepares a session of a file with
    GGML weights, unless the host set ``NUM_THREADS`` itself. onert reads the variable when it
    *prepares* a session (its first run, or ``prepare()``), per session: set around prepare and
    removed, the session keeps its count and later sessions get the default again (measured
    2026-12-05). The variable is process-wide for the duration: a session another thread
    prepares at that moment gets the same count."""
    if not active or "NUM_THREADS" in os.environ:
        yield
        return
    os.environ["NUM_THREADS"] = str(ggml_thread_count())
    try:
        yield
    finally:
        os.environ.pop("NUM_THREADS", None)


def check_ggml_runs(path) -> bool:
    """Raise :class:`RuntimeFailure` if ``path`` has GGML tensors and onert cannot run them here;
    True when it has GGML tensors (and they run)."""
    if not has_block_tensors(path):
        return False
    why = ggml_unsupported_reason()
    if why:
        raise RuntimeFailure(f"{path} has GGML block-quantized weights, which onert cannot run on this "
                             f"machine: {why}. The file itself is valid (circle_fx.verify); run it on a CPU "
                             "with AVX-512, or export with quantize=QuantConfig(weights='int8', blocks_from_rows=None) "
                             "(`--quantize int8-weights --int8-rows`: int8 rows at every row count, no GGML tensor)")
    return True
