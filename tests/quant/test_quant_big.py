"""Big Llamas built on the meta device export to one file under 2 GiB and run in onert: a 253M
model with the 1.5B config's layer sizes in q4_0, held to one float copy plus the file while
converting (the full 1.5B / 3B runs take minutes: benchmarks/big_models.py); and a >= 600M-parameter
Llama (hidden 1536, 24 layers, vocab 32000) with int8 weights. Its float32 file (2.8 GB) could not:
onert 0.1.0 loads nothing over 2 GiB.

Runs ``tests/big_llama.py`` in a subprocess so the peak RSS measured is this model's alone.
Measured on the 2-core box: 42 s for the whole test (34 s in the script: build 12.5 s, export +
save 11.3 s, eager reference 7 s, onert load + run 2.6 s; 2.9 min when the box had a load
average of 10), conversion peak RSS 4.0 GB (the float model itself is 2.8 GB), onert peak RSS
0.8 GB, relative logits error 8.5% and top-1 agreement 94% over 32 positions (24 layers).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where big_llama.py lives


#: the 1.5B config's layer sizes (benchmarks/big_models.py) with 2 of its 24 layers: 253M parameters
LAYERS_OF_1_5B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=2, num_attention_heads=16,
                      num_key_value_heads=4)


def _run(tmp_path, *args) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "big_llama.py"), str(tmp_path), *args],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    print(json.dumps(r, indent=1))  # the numbers, with -s
    return r


@pytest.mark.slow
def test_600m_llama_int8_single_file_runs_in_onert(tmp_path):
    r = _run(tmp_path)
    assert r["params"] >= 600_000_000
    assert r["file_bytes"] < 2 ** 31 and r["file_bytes"] <= 0.3 * r["float32_bytes"]
    assert r["shape_ok"] and r["rms_norm"] == 2 * r["layers"] + 1
    assert r["rel_err"] <= 0.15 and r["top1"] >= 0.8
    assert r["peak_rss_convert"] < 10 * 2 ** 30 and r["peak_rss_onert"] < 4 * 2 ** 30
    os.unlink(r["path"])  # 0.7 GB: do not leave it in pytest's kept temp dirs


@pytest.mark.slow
def test_q4_0_conversion_holds_one_float_copy_and_the_file(tmp_path):
    """q4_0 streams: converting holds the built float model plus about the packed weights, whatever
    the size (the 1.5B and 3B runs of benchmarks/big_models.py); the file runs in onert and matches
    the eager model holding the file's dequantized weights.

    Measured on the 2-core box (load ~10): 253M parameters, float 1.01 GB, file 142 MB, conversion
    above the built model 184 MB (657 MB before the quantization streamed: this assertion failed),
    onert vs the dequantized eager model: rel. error 2.2 %, top-1 28/32 (random logits have tiny
    margins; vs the float model 36 %, the Q4_0 rounding itself).
    """
    r = _run(tmp_path, "q4_0-all", json.dumps(LAYERS_OF_1_5B))  # every weight Q4_0: an exact dequantized reference
    assert r["weight_bytes_by_dtype"].get("GGML_Q4_0", 0) > 0.99 * r["file_bytes"]
    assert r["file_bytes"] <= 4.6 / 32 * r["float32_bytes"]  # 4.5 bits per weight
    above = r["peak_rss_convert"] - r["rss_built"]
    assert above <= r["file_bytes"] + 0.1 * r["float32_bytes"] + (100 << 20), above / 2 ** 20
    if "onert_skipped" in r:  # the conversion is checked; onert's GGML kernels cannot run on this CPU
        os.unlink(r["path"])
        pytest.skip(r["onert_skipped"])
    assert r["shape_ok"]
    assert r["rel_err_dequantized"] <= 0.05 and r["top1_dequantized"] >= 0.75
    os.unlink(r["path"])
