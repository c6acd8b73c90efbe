"""Is circle_fx's save slower than the disk? ``CircleModel.save`` against a plain ``write`` of
the same number of bytes, interleaved in one process.

    python benchmarks/write_speed.py [--layers 12] [--repeat 4] [--out-dir /tmp]

The model is convert_speed.py's Llama (12 layers: a ~500 MB file). Each timed write goes to a
new file (removed outside the timing) after a 2 s pause, as a user's first save would: on this
VM a write into pages the kernel just freed is several times faster than one into fresh page
cache, and a back-to-back loop would measure only the former. The "plain write" row is one
``f.write`` of a random numpy buffer of the file's size: what any writer of that file pays.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()

    import circle_fx
    from convert_speed import build_model

    model, ids = build_model(args.layers)
    cm = circle_fx.export(model, (ids,), example_kwargs={"use_cache": False}, verbose=False)
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="circle_fx_write_")
    warm = os.path.join(out_dir, "warm.circle")
    cm.save(warm)
    size = os.path.getsize(warm)
    os.unlink(warm)
    blob = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    times: dict[str, list[float]] = {"circle_fx save": [], "plain write": []}
    for i in range(args.repeat):
        for name in times:
            path = os.path.join(out_dir, f"{i}_{name.split()[0]}.circle")
            time.sleep(2)
            t = time.perf_counter()
            if name == "circle_fx save":
                cm.save(path)
            else:
                with open(path, "wb") as f:
                    f.write(blob)
            times[name].append(time.perf_counter() - t)
            os.unlink(path)
    print(f"{args.layers}-layer Llama, file {size / 1e6:.0f} MB in {out_dir}; load {os.getloadavg()[0]:.2f}")
    print(f"{'':16s} {'median s':>9s}  runs (interleaved)")
    for name, ts in times.items():
        print(f"{name:16s} {statistics.median(ts):9.3f}  {[round(t, 3) for t in ts]}")
    ratio = statistics.median(times["circle_fx save"]) / statistics.median(times["plain write"])
    print(f"save / plain write: {ratio:.2f}")
    if args.out_dir is None:
        os.rmdir(out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
