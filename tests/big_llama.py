"""A big Llama exported with quantized weights, end to end, in one process.

    python tests/big_llama.py OUT_DIR [QUANTIZE|int8-rows [CONFIG_JSON]]   # prints one JSON line of measurements

Defaults: the >= 600M-parameter ``CONFIG`` below with ``int8-weights``; CONFIG_JSON updates it
(``benchmarks/big_models.py`` runs 1.5B- and 3B-sized configs through it). With
``BIG_LLAMA_WEIGHTS_FILE=PATH`` the weights live in a shared mapping of that file (see ``_file_backed``).

Used by ``tests/quant/test_quant_big.py`` (slow) in a subprocess, so its peak RSS is this run's
alone. The model is built on the meta device and materialised with ``to_empty`` + in-place
``normal_``: one float copy of the weights exists, never two (a plain constructor would
initialise, and ``load_state_dict`` of random weights would hold a second copy).
onert runs the file in a child process of its own (``USE_MMAPED_DATA=1``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import torch

CONFIG = dict(vocab_size=32000, hidden_size=1536, intermediate_size=4096, num_hidden_layers=24,
              num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=512, use_cache=False)
SEQ = 32


def peak_rss() -> int:
    """This process's peak resident set (VmHWM; ru_maxrss would carry a parent's peak over exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def current_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def _file_backed(model, path: str) -> None:
    """Give every parameter of a meta-device ``model`` storage in one shared mapping of the file
    ``path`` (as a checkpoint loaded with mmap would be): still one float copy, but page cache the
    kernel can write back and drop under memory pressure instead of killing the process (the
    2-core box is shared; a 1.5B model's 6.4 GB of anonymous memory was OOM-killed there)."""
    params = list(model.named_parameters())
    total = sum(p.numel() for _, p in params)
    flat = torch.from_file(path, shared=True, size=total, dtype=torch.float32)
    off = 0
    for name, p in params:
        module = model.get_submodule(name.rpartition(".")[0])
        view = flat[off:off + p.numel()].view(p.shape)
        module._parameters[name.rpartition(".")[2]] = torch.nn.Parameter(view, requires_grad=False)
        off += p.numel()


def build(seed: int = 0, config: dict | None = None):
    """``(model, ids)``: random weights (std 0.02, norms 1) written in place, layer by layer."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(**{**CONFIG, **(config or {})})
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    backing = os.environ.get("BIG_LLAMA_WEIGHTS_FILE")
    if backing:
        _file_backed(model, backing)
    else:
        model = model.to_empty(device="cpu")
    model = model.eval()
    model.model.rotary_emb = LlamaRotaryEmbedding(cfg)  # its buffers are computed, not loaded
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    ids = torch.randint(0, cfg.vocab_size, (1, SEQ), generator=torch.Generator().manual_seed(seed + 1))
    return model, ids


def dequantize_in_place(model, kind_name: str) -> None:
    """Replace every 2-D weight by what its ``kind_name`` blocks hold (pack, then dequantize, a few
    rows at a time, in place: no second copy of the model). The eager model is then the exact
    float reference of an all-``kind_name`` file: what is left is the runtime's own arithmetic
    (ggml's kernels quantize the activations to Q8_0 blocks), not the weight rounding."""
    from circle_fx.circle import ggml
    from circle_fx.quant.ggml import pack

    kind = ggml.BY_NAME[kind_name]
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() != 2:
                continue
            for i in range(0, p.shape[0], 1024):
                rows = p[i:i + 1024]
                blocks = pack(rows, kind)[0].numpy()
                rows.copy_(torch.from_numpy(ggml.dequantize(kind, blocks, rows.shape)))


_RUNNER = textwrap.dedent("""
    import sys, time, numpy as np, onert
    path, ids_path, out_path = sys.argv[1:4]
    t = time.perf_counter()
    sess = onert.infer.session(path)
    out = sess.infer([np.load(ids_path)])[0]
    np.save(out_path, out)
    hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    print(time.perf_counter() - t, hwm * 1024)
""")


def main(out_dir: str, quantize: str = "int8-rows", config: dict | None = None) -> dict:
    """``quantize``: a preset, or ``"int8-rows"``: int8 weights at every row count (the default
    int8-weights stores these 32-row linears as Q8_0 blocks, ``QuantConfig.blocks_from_rows``), or
    ``"q4_0-all"``: every weight Q4_0 (lm_head too) without calibration, the q4_0 preset before
    issue 33 (the preset keeps lm_head at Q8_0 and calibrates the in-memory model)."""
    import circle_fx

    config = {**CONFIG, **(config or {})}
    t0 = time.perf_counter()
    model, ids = build(config=config)
    params = sum(p.numel() for p in model.parameters())
    rss_built = current_rss()  # the float model (one copy) plus the interpreter and libraries
    t1 = time.perf_counter()
    mode = (circle_fx.QuantConfig(blocks_from_rows=None) if quantize == "int8-rows" else
            circle_fx.QuantConfig(weights="q4_0", embedding="q4_0", lm_head="q4_0", calibration=None)
            if quantize == "q4_0-all" else quantize)
    cm = circle_fx.export(model, (ids,), quantize=mode, verbose=False)
    path = cm.save(os.path.join(out_dir, "big.circle"))
    rss_convert = peak_rss()  # before the eager reference: the conversion's own peak
    t2 = time.perf_counter()
    rms = cm.op_histogram()["RMS_NORM"]
    by_dtype = cm.weight_bytes_by_dtype()
    del cm
    with torch.no_grad():
        ref = model(ids).logits.numpy()
    ref_dq = None
    if set(by_dtype) <= {"GGML_Q4_0", "float32", "int32", "int64"}:  # every weight Q4_0: an exact reference
        dequantize_in_place(model, "q4_0")
        with torch.no_grad():
            ref_dq = model(ids).logits.numpy()
    t3 = time.perf_counter()
    del model
    ids_path, out_path = os.path.join(out_dir, "ids.npy"), os.path.join(out_dir, "logits.npy")
    np.save(ids_path, ids.numpy().astype(np.int64))
    common = {"params": params, "quantize": quantize, "path": path, "file_bytes": os.path.getsize(path),
              "float32_bytes": 4 * params, "weight_bytes_by_dtype": by_dtype, "rms_norm": rms,
              "layers": config["num_hidden_layers"], "build_s": t1 - t0, "export_save_s": t2 - t1,
              "eager_s": t3 - t2, "rss_built": rss_built, "peak_rss_convert": rss_convert}
    from circle_fx.circle.ggml_support import check_ggml_runs
    from circle_fx.errors import RuntimeFailure

    try:
        check_ggml_runs(path)
    except RuntimeFailure as e:  # GGML weights on a CPU whose onert GGML kernels die (no AVX-512)
        return {**common, "onert_skipped": str(e), "total_s": time.perf_counter() - t0}
    proc = subprocess.run([sys.executable, "-c", _RUNNER, path, ids_path, out_path], capture_output=True,
                          text=True, env=dict(os.environ, USE_MMAPED_DATA="1"), timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"onert failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    onert_seconds, rss_onert = proc.stdout.split()
    got = np.load(out_path)
    return {**common, "onert_s": float(onert_seconds), "total_s": time.perf_counter() - t0,
            "peak_rss_onert": int(rss_onert),
            "rel_err": float(np.linalg.norm(got - ref) / np.linalg.norm(ref)),
            "top1": float((got.argmax(-1) == ref.argmax(-1)).mean()), "positions": int(got.shape[1]),
            # against the eager model holding the file's dequantized weights (q4_0 only)
            "rel_err_dequantized": None if ref_dq is None else float(np.linalg.norm(got - ref_dq) / np.linalg.norm(ref_dq)),
            "top1_dequantized": None if ref_dq is None else float((got.argmax(-1) == ref_dq.argmax(-1)).mean()),
            "shape_ok": list(got.shape) == list(ref.shape)}


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(main(args[0], *args[1:2], *([json.loads(args[2])] if len(args) > 2 else []))))
