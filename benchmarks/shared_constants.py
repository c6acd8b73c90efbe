"""File size with and without sharing repeated constants, on the real SmolLM2-135M checkpoint.

    python benchmarks/shared_constants.py [--seq 128] [--int8]

SmolLM2-135M-Instruct (``tests/checkpoint.py``: tied embedding, 30 layers, vocab 49152) is
exported once as circle_fx does by default (``ModelBuilder.share_buffers``: each distinct
constant stored once) and once with sharing switched off for the measurement (the method
replaced by a no-op in this process only), and both files are checked: ``verify`` counts the
buffers whose bytes repeat another's, and the shared file runs in onert against eager.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "tests")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=128, help="input ids 1 x SEQ")
    ap.add_argument("--int8", action="store_true", help='also quantize="int8-weights"')
    args = ap.parse_args(argv)
    import warnings

    import numpy as np
    import torch

    import checkpoint
    import circle_fx
    from circle_fx.emit.builder import ModelBuilder

    if not checkpoint.available():
        print(checkpoint.SKIP_REASON)
        return 1
    model = checkpoint.load_model()
    ids = torch.randint(0, model.config.vocab_size, (1, args.seq), generator=torch.Generator().manual_seed(0))
    quantize = "int8-weights" if args.int8 else None
    out = tempfile.mkdtemp(prefix="circle_fx_shared_")
    rows = []
    share = ModelBuilder.share_buffers
    for label, patched in (("shared (default)", False), ("not shared", True)):
        ModelBuilder.share_buffers = (lambda self: 0) if patched else share
        t0 = time.perf_counter()
        cm = circle_fx.export(model, (ids,), example_kwargs={"use_cache": False}, quantize=quantize, verbose=False)
        seconds = time.perf_counter() - t0
        path = cm.save(os.path.join(out, f"{'unshared' if patched else 'shared'}.circle"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rep = circle_fx.verify(path)
        rows.append((label, os.path.getsize(path), rep.duplicate_buffers, rep.duplicate_bytes, cm.builder.shared,
                     seconds, cm.report.timings.get("verify", 0.0), cm if not patched else None))
    ModelBuilder.share_buffers = share
    cfg = model.config
    print(f"SmolLM2-135M-Instruct float32{' int8-weights' if args.int8 else ''}, input ids 1x{args.seq}, "
          f"tie_word_embeddings={cfg.tie_word_embeddings}, vocab {cfg.vocab_size}, hidden {cfg.hidden_size}, "
          f"{cfg.num_hidden_layers} layers (embedding table {cfg.vocab_size * cfg.hidden_size * 4 / 2**20:.1f} MiB)\n")
    print(f"{'':<18}{'file MiB':>10}{'repeated bufs':>15}{'repeated MiB':>14}{'export s':>10}{'verify s':>10}")
    for label, size, nd, nb, shared, sec, ver, _ in rows:
        print(f"{label:<18}{size / 2**20:>10.1f}{nd:>15}{nb / 2**20:>14.1f}{sec:>10.1f}{ver:>10.2f}")
    (_, s_size, *_), (_, u_size, *_) = rows
    shared = rows[0][4]
    print(f"\nsharing merged {shared[0]} buffers, {shared[1] / 2**20:.1f} MiB; file {u_size / 2**20:.1f} -> "
          f"{s_size / 2**20:.1f} MiB ({100 * (u_size - s_size) / u_size:.1f} % smaller)")
    cm = rows[0][7]
    with torch.no_grad():
        want = model(ids, use_cache=False).logits.numpy()
    (got,) = cm.run(ids)
    diff = float(np.abs(got - want).max())
    top1 = float((got.argmax(-1) == want.argmax(-1)).mean())
    print(f"shared file in onert vs eager: max|diff| {diff:.2e}, top-1 agreement {top1:.3f}")
    for name in os.listdir(out):
        os.unlink(os.path.join(out, name))
    os.rmdir(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
