"""Side by side: circle_fx in onert vs ExecuTorch XNNPACK vs torch eager, decode and prefill.

    python benchmarks/engines.py                       # build what is missing, measure, print the table
    python benchmarks/engines.py --rounds 5 --work DIR # reuse the artifacts in DIR (built once, kept)
    python benchmarks/engines.py --engines f32,int8,torch --threads 1

Model: the 125M Llama of ``convert_speed.py`` / ``llm_decode.py`` (12 layers, hidden 768,
intermediate 2048, 12 heads, 4 KV heads, vocab 32000), random weights (seed 0), KV cache of
256 positions, prefill of 128 tokens.

Engines (``--engines``, comma separated):

- circle_fx in onert, one per weight mode: ``f32``, ``int8`` (``int8-weights``), and each GGML
  mode circle_fx accepts (``q8_0``, ``q4_0``; skipped with a note where the installed
  circle_fx does not know them). ``export_llm(max_seq_len=256, prefill_len=128)``; decode is
  ``LLMRunner.step``, prefill is ``LLMRunner.run_prefill`` of 128 ids.
- ExecuTorch 1.x with the XNNPACK delegate: ``et-fp32``, ``et-8da8w``, ``et-8da4w`` (torchao's
  ``Int8DynamicActivationIntxWeightConfig``, int8 per channel / int4 groups of 32), exported
  through transformers' ``TorchExportableModuleWithStaticCache`` as two programs (1 token and
  128 tokens, each with its own static cache). ExecuTorch is a benchmark-only dependency,
  never imported by circle_fx: give the interpreter that has it with ``--et-python`` (default:
  this one). Engines it cannot build are reported, not fatal.
- ``torch``: eager transformers with a ``DynamicCache``.
- ``NAME@LABEL`` (e.g. ``int8@before``): engine NAME with its own artifact directory
  ``WORK/NAME@LABEL``, so one interleaved run can compare two builds of one engine (a directory
  built by an older circle_fx against a fresh one); the table names the row NAME@LABEL.

Each measurement is a fresh child process pinned (``sched_setaffinity``) to ``threads`` cores,
with the engine's thread count set to match (onert ``NUM_THREADS``, XNNPACK's threadpool,
``torch.set_num_threads``), except a circle_fx package whose manifest says it has GGML weights:
its sessions get the thread count ``LLMRunner`` chooses (for a file with GGML weights the cores
idle when the session is prepared, ``ggml_support.ggml_thread_count``; onert's default for the
other; docs/onert-findings.md: two ggml threads win with the second core idle, lose 2-10x with it busy). The children run interleaved: round r measures every engine once
per thread setting, in an order rotated per round, so background load hits all engines alike;
the table shows the median over rounds. ``cpu/wall`` is process CPU time over wall time during
the measured calls: 1.0 means one busy core, 2.0 both.

The bandwidth bound: a child measures read bandwidth (numpy sums of a 1 GiB array, one
thread per core) and the bound for an engine is the bytes of weights it reads per decode step
divided by that bandwidth: no engine that streams its weights from memory once per token can
decode faster.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

CACHE, PREFILL, DECODE_AT, DECODE_STEPS, PREFILL_REPS = 256, 128, 128, 24, 3
CIRCLE_MODES = {"f32": None, "int8": "int8-weights", "q8_0": "q8_0", "q4_0": "q4_0"}
# bytes per weight the engine streams per decode step (GGML: 32 weights + one float16 scale per block)
BYTES_PER_WEIGHT = {"f32": 4.0, "int8": 1.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "et-fp32": 4.0,
                    "et-8da8w": 1.0, "et-8da4w": 0.5 + 2 / 32, "torch": 4.0}
ET_VARIANTS = ("et-fp32", "et-8da8w", "et-8da4w")


def build_model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                      num_attention_heads=12, num_key_value_heads=4)
    return LlamaForCausalLM(cfg).eval()


def streamed_weights(model) -> int:
    """Weights read per decode step: every linear (lm_head included), one embedding row."""
    import torch

    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


# ---------------------------------------------------------------- building (not timed)

def base(engine: str) -> str:
    """``int8@before`` -> ``int8``: the engine a labelled variant measures."""
    return engine.split("@")[0]


def build_circle(engine: str, out: str) -> None:
    import circle_fx

    circle_fx.export_llm(build_model(), max_seq_len=CACHE, prefill_len=PREFILL,
                         quantize=CIRCLE_MODES[base(engine)]).save(out)


def build_et(variant: str, out: str) -> None:
    """Two .pte programs (1 and 128 tokens) of the static-cache model, lowered to XNNPACK."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    model = build_model()
    if variant != "et-fp32":
        from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
        from torchao.quantization.granularity import PerAxis, PerGroup

        bits, gran = (torch.int8, PerAxis(0)) if variant == "et-8da8w" else (torch.int4, PerGroup(32))
        quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=bits, weight_granularity=gran))
    model.generation_config.cache_implementation = "static"
    model.generation_config.use_cache = True

    class Forward(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=CACHE)

        def forward(self, input_ids, cache_position):
            # The static cache's layers hold the tensors they were built with; export swaps the module's
            # buffers for traced ones, so point the layers at those, else the cache is lifted as
            # constants (twice) and ExecuTorch's decompositions fail on the duplicated mutated inputs.
            inner = self.inner
            for i, layer in enumerate(inner.static_cache.layers):
                layer.keys, layer.values = getattr(inner, f"key_cache_{i}"), getattr(inner, f"value_cache_{i}")
                layer.cumulative_length = getattr(inner, f"cumulative_length_{i}")
            return inner(input_ids=input_ids, cache_position=cache_position)

    os.makedirs(out, exist_ok=True)
    model.requires_grad_(False)
    with torch.no_grad():
        for name, n in (("decode", 1), ("prefill", PREFILL)):
            args = (torch.zeros(1, n, dtype=torch.long), torch.arange(n, dtype=torch.long))
            ep = torch.export.export(Forward(), args, strict=False)
            prog = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
            with open(os.path.join(out, f"{name}.pte"), "wb") as f:
                prog.write_to_file(f)


# ---------------------------------------------------------------- measuring (one child per number)

def _timed(fn, reps):
    """Median wall seconds of ``reps`` calls and CPU/wall over all of them."""
    walls, c0, w0 = [], time.process_time(), time.perf_counter()
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t)
    return statistics.median(walls), (time.process_time() - c0) / (time.perf_counter() - w0)


def run_circle(art: str):
    from circle_fx.llm import manifest as mf
    from circle_fx.llm.runner import LLMRunner

    if (mf.read(art).get("weights") or {}).get("ggml"):  # the package's own thread count (docstring)
        os.environ.pop("NUM_THREADS", None)
    r = LLMRunner(art)
    prompt = [3 + i % 1000 for i in range(PREFILL)]
    r.run_prefill(prompt)  # warm-up
    prefill = _timed(lambda: r.run_prefill(prompt), PREFILL_REPS)
    pos = iter(range(DECODE_AT, CACHE))
    r.step(1, next(pos))
    decode = _timed(lambda: r.step(1, next(pos)), DECODE_STEPS)
    return decode, prefill


def run_et(art: str, threads: int):
    import torch
    from executorch.runtime import Runtime

    try:
        from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

        _unsafe_reset_threadpool(threads)
    except ImportError:  # pragma: no cover - older ExecuTorch: the affinity mask still bounds it
        pass
    rt = Runtime.get()
    dec = rt.load_program(os.path.join(art, "decode.pte")).load_method("forward")
    pre = rt.load_program(os.path.join(art, "prefill.pte")).load_method("forward")
    ids = torch.tensor([[3 + i % 1000 for i in range(PREFILL)]])
    zero = torch.arange(PREFILL)
    pre.execute([ids, zero])
    prefill = _timed(lambda: pre.execute([ids, zero]), PREFILL_REPS)
    pos = iter(range(DECODE_AT, CACHE))
    tok = torch.tensor([[1]])
    dec.execute([tok, torch.tensor([next(pos)])])
    decode = _timed(lambda: dec.execute([tok, torch.tensor([next(pos)])]), DECODE_STEPS)
    return decode, prefill


def run_torch():
    import torch
    from transformers import DynamicCache

    model = build_model()
    ids = torch.tensor([[3 + i % 1000 for i in range(PREFILL)]])
    with torch.no_grad():
        model(ids, use_cache=False)
        prefill = _timed(lambda: model(ids, cache=DynamicCache(config=model.config), use_cache=True), PREFILL_REPS)
        cache = DynamicCache(config=model.config)
        model(ids, cache=cache, use_cache=True)
        tok = torch.tensor([[1]])

        def step():
            model(tok, cache=cache, use_cache=True)
            cache.crop(-1)  # back to position 128

        step()
        decode = _timed(step, DECODE_STEPS)
    return decode, prefill


def bandwidth(threads: int) -> float:
    """GB/s reading a 1 GiB float32 array, ``threads`` threads each summing its own slice."""
    import threading

    import numpy as np

    a = np.ones(1 << 28, np.float32)
    parts = np.array_split(a, threads)
    best = 0.0
    for _ in range(5):
        ts = [threading.Thread(target=p.sum) for p in parts]
        t = time.perf_counter()
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        best = max(best, a.nbytes / (time.perf_counter() - t) / 1e9)
    return best


def child(args) -> None:
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.threads]))
    if args.child == "bandwidth":
        print(json.dumps({"gbps": bandwidth(args.threads)}))
        return
    if args.child == "build":
        (build_et if base(args.engine).startswith("et-") else build_circle)(base(args.engine), args.art)
        print(json.dumps({"built": args.art}))
        return
    import torch

    torch.set_num_threads(args.threads)
    if base(args.engine).startswith("et-"):
        decode, prefill = run_et(args.art, args.threads)
    elif base(args.engine) == "torch":
        decode, prefill = run_torch()
    else:
        decode, prefill = run_circle(args.art)
    print(json.dumps({"decode": decode, "prefill": prefill}))


def spawn(python: str, argv: list[str], threads: int, quiet: bool = True):
    env = dict(os.environ, NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore")
    p = subprocess.run([python, os.path.abspath(__file__), "--threads", str(threads), *argv], env=env,
                       capture_output=True, text=True)
    if p.returncode:
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        return None, tail
    return json.loads(p.stdout.strip().splitlines()[-1]), None


def et_missing(python: str) -> str | None:
    """Why ``python`` cannot run the ExecuTorch engines (None: it can): asked in a child, never imported here."""
    probe = "import executorch, torchao; from executorch.runtime import Runtime"
    p = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if p.returncode == 0:
        return None
    tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
    return (f"skipped: ExecuTorch is not installed for {python} ({tail[:80]}); "
            "see benchmarks/README.md for its venv and pass --et-python")


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def circle_modes() -> set[str]:
    """The weight modes the installed circle_fx accepts (asked, not assumed)."""
    from circle_fx.errors import InputError
    from circle_fx.quant.config import resolve_quantize

    known = set()
    for e, mode in CIRCLE_MODES.items():
        try:
            resolve_quantize(mode)
            known.add(e)
        except InputError:
            pass
    return known


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", default=",".join([*CIRCLE_MODES, *ET_VARIANTS, "torch"]))
    ap.add_argument("--threads", default="1,2", help="thread settings to measure (comma separated)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", help="artifact directory, kept between runs (default: a new temp dir)")
    ap.add_argument("--et-python", default=sys.executable, help="interpreter with executorch installed")
    ap.add_argument("--child", choices=["run", "build", "bandwidth"], help=argparse.SUPPRESS)
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--art", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.threads = int(args.threads)
        child(args)
        return 0

    work = args.work or tempfile.mkdtemp(prefix="engines_")
    engines, notes, failed = args.engines.split(","), {}, set()
    known = circle_modes()
    threads = [int(t) for t in args.threads.split(",")]
    python = {e: (args.et_python if base(e).startswith("et-") else sys.executable) for e in engines}
    et_why = et_missing(args.et_python) if any(base(e).startswith("et-") for e in engines) else None
    load_start = load()
    for e in engines:
        if base(e).startswith("et-") and et_why:
            notes[e] = et_why
            failed.add(e)
            continue
        if base(e) in CIRCLE_MODES and base(e) not in known:
            notes[e] = f"circle_fx has no quantize={CIRCLE_MODES[base(e)]!r}"
            failed.add(e)
            continue
        art = os.path.join(work, e)
        if base(e) != "torch" and not os.path.isdir(art):
            print(f"building {e} ...", file=sys.stderr)
            _, err = spawn(python[e], ["--child", "build", "--engine", e, "--art", art], threads=2)
            if err:
                notes[e] = f"build failed: {err[:120]}"
                failed.add(e)
    live = [e for e in engines if e not in failed]
    results = {(e, t): [] for e in live for t in threads}
    for r in range(args.rounds):
        order = live[r % len(live):] + live[: r % len(live)]
        for e in order:
            for t in threads:
                res, err = spawn(python[e], ["--child", "run", "--engine", e, "--art", os.path.join(work, e)], t)
                if err:
                    notes[e] = f"run failed: {err[:120]}"
                else:
                    results[(e, t)].append(res)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    bw = {t: spawn(sys.executable, ["--child", "bandwidth"], t)[0]["gbps"] for t in threads}
    weights = streamed_weights(build_model())

    def med(e, t, key, i):
        vals = [x[key][i] for x in results.get((e, t), [])]
        return statistics.median(vals) if vals else None

    def size(e):
        art = os.path.join(work, e)
        if not os.path.isdir(art):
            return "-"
        files = [f for f in os.listdir(art) if f.endswith((".circle", ".pte"))]
        return f"{sum(os.path.getsize(os.path.join(art, f)) for f in files) / 2**20:.0f} MiB ({len(files)})"

    print(f"\n125M Llama, KV cache {CACHE}, decode at position {DECODE_AT} (median of {DECODE_STEPS} steps), "
          f"prefill {PREFILL} tokens; median over {args.rounds} interleaved rounds; cpu/wall in brackets")
    print(f"machine: {os.cpu_count()} cores; {load_start} at the start, {load()} at the end "
          "(other processes' load slows every engine; compare rows of one run only)")
    head = [f"decode {t}thr" for t in threads] + [f"prefill {t}thr" for t in threads]
    head += [f"bound {t}c" for t in threads] + ["files"]
    print(f"{'engine':<14}" + "".join(f"{h:>17}" for h in head))
    print("-" * (14 + 17 * len(head)))
    for e in engines:
        row = []
        for key, scale in (("decode", 1e3), ("prefill", 1e3)):
            for t in threads:
                v, c = med(e, t, key, 0), med(e, t, key, 1)
                row.append("-" if v is None else f"{v * scale:.1f} ms ({c:.2f})")
        for t in threads:
            row.append(f"{weights * BYTES_PER_WEIGHT[base(e)] / (bw[t] * 1e9) * 1e3:.1f} ms")
        row.append("-" if base(e) == "torch" else size(e))
        print(f"{e:<14}" + "".join(f"{c:>17}" for c in row))
    print(f"\nread bandwidth: " + ", ".join(f"{t} core(s) {bw[t]:.1f} GB/s" for t in threads)
          + f"; weights streamed per decode step: {weights / 1e6:.1f} M")
    for e, n in notes.items():
        print(f"  {e}: {n}")
    print(f"artifacts in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
