"""``verify`` raises only ``VerifyError`` for any bytes: hypothesis fuzzing of random bytes,
truncations and bit flips of real emitted files, in a separate process so that a crash
(a segfault in a reader) fails the test instead of killing pytest."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import circle_fx
from test_verify import Cover

WORKER = os.path.join(os.path.dirname(__file__), "verify_fuzz_worker.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def real_files(tmp_path_factory):
    """A float and an int8-weights model (GATHER, FC, RMS_NORM, BATCH_MATMUL, quantization)."""
    torch.manual_seed(0)
    model = Cover().eval()
    inputs = (torch.randint(0, 10, (2, 3)), torch.randn(2, 3, 8))
    d = tmp_path_factory.mktemp("fuzz")
    return [circle_fx.export(model, inputs).save(str(d / "float.circle")),
            circle_fx.export(model, inputs, quantize="int8-weights").save(str(d / "int8.circle"))]


def run_worker(files, examples: int, derandomize: bool) -> None:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, WORKER, str(examples), "1" if derandomize else "0", *files],
                       capture_output=True, text=True, env=env, timeout=3600)
    if r.returncode < 0:
        pytest.fail(f"verify crashed the process (signal {-r.returncode}):\n{r.stdout}\n{r.stderr[-4000:]}")
    assert r.returncode == 0, f"verify raised something other than VerifyError:\n{r.stdout[-6000:]}"
    assert r.stdout.count("examples OK") == 4, r.stdout


def test_verify_fuzz_default(real_files):
    run_worker(real_files, 75, derandomize=True)  # 4 strategies x 75: a few hundred files


@pytest.mark.slow
def test_verify_fuzz_thousands(real_files):
    run_worker(real_files, 1500, derandomize=False)  # 6,000 files, a new seed each run


def test_worker_reports_other_exceptions(real_files, tmp_path, monkeypatch):
    """The harness can fail: a verify that leaks an IndexError is caught and reported."""
    shim = tmp_path / "sitecustomize.py"
    shim.write_text("import circle_fx\n"
                    "def _leaky(src):\n    raise IndexError('list index out of range')\n"
                    "circle_fx.verify = _leaky\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(AssertionError, match="IndexError"):
        run_worker(real_files, 2, derandomize=True)
