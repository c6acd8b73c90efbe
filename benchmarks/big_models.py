"""1.5B- and 3B-parameter Llama configs exported with ``q4_0`` to one file each, run in onert.

    python benchmarks/big_models.py [1.5b] [3b] [--quantize q4_0] [--work DIR]

Each config runs ``tests/big_llama.py`` in a child process of its own (so each peak RSS is that
model's alone): built on the meta device and filled in place with random weights (one float
copy), ``circle_fx.export(quantize=...)`` of a 32-token forward to one ``.circle`` file, saved,
the eager logits computed, then the file loaded and run by onert in a grandchild
(``USE_MMAPED_DATA=1``) and compared with eager. Prints one table: parameters, float32 size,
file size (onert 0.1.0 loads nothing over 2 GiB), conversion peak RSS and what it holds above
the built float model, the times, onert's peak RSS, and the agreement with eager.

Too slow for the test suite (minutes per config on 2 cores): ``tests/quant/test_quant_big.py``
holds the same memory property on a model with the 1.5B config's layer sizes and fewer layers.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

#: Llama-3.2-1B / Qwen2.5-1.5B-sized and Llama-3.2-3B-sized layers, vocab 32000, untied lm_head
CONFIGS = {
    "1.5b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=16,
                 num_key_value_heads=4),
    "3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
               num_key_value_heads=8),
}


def run(name: str, quantize: str, work: str, file_backed: bool = False) -> dict:
    out = os.path.join(work, name)
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    if file_backed:
        env["BIG_LLAMA_WEIGHTS_FILE"] = os.path.join(out, "weights.f32")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "big_llama.py"), out, quantize,
                           json.dumps(CONFIGS[name])], capture_output=True, text=True, env=env)
    if proc.returncode != 0:  # -9: the kernel's OOM killer (a shared machine's free memory, not only ours)
        lines = [x for x in proc.stderr.splitlines() if x.strip() and "Warning" not in x and not x.startswith("W1")]
        return {"name": name, "error": f"exit {proc.returncode}" + (f": {lines[-1]}" if lines else "")}
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    os.unlink(r["path"])
    if file_backed:
        os.unlink(env["BIG_LLAMA_WEIGHTS_FILE"])
    return {"name": name, **r}


def table(rows: list[dict]) -> str:
    gb = lambda b: f"{b / 2 ** 30:.2f}"
    head = ("config", "params", "float32 GiB", "file MiB", "< 2 GiB", "built RSS GiB", "convert peak GiB",
            "above built GiB", "export+save s", "onert s", "onert RSS GiB", "rel err", "top-1")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | failed: {r['error']} |")
            continue
        lines.append("| " + " | ".join([
            r["name"], f"{r['params'] / 1e9:.3f}B", gb(r["float32_bytes"]), f"{r['file_bytes'] / 2 ** 20:.1f}",
            "yes" if r["file_bytes"] < 2 ** 31 else "NO", gb(r["rss_built"]), gb(r["peak_rss_convert"]),
            gb(r["peak_rss_convert"] - r["rss_built"]), f"{r['export_save_s']:.0f}", f"{r['onert_s']:.1f}",
            gb(r["peak_rss_onert"]), f"{r['rel_err']:.3f}", f"{r['top1']:.2f}"]) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--quantize", default="q4_0")
    ap.add_argument("--file-backed", action="store_true",
                    help="the float weights in a shared file mapping under --work (page cache: evictable on a "
                         "busy machine, where 6.4 GB of anonymous memory got OOM-killed)")
    ap.add_argument("--work", default=None, help="directory for the files (default: a temporary one)")
    args = ap.parse_args(argv)
    work = args.work or tempfile.mkdtemp(prefix="big_models_")
    rows = []
    for name in args.configs:
        rows.append(run(name, args.quantize, work, args.file_backed))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"quantize={args.quantize}" + (" (float weights file-backed)" if args.file_backed else ""))
    print(table(rows))


if __name__ == "__main__":
    main()
