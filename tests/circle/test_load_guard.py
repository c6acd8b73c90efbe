"""Files reach onert only after ``verify``: ``CircleModel.load``, the LLM runner and the CLI
refuse a corrupt or truncated file with an error naming it, and the process survives
(onert 0.1.0 segfaults on a truncated decode.circle)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx import VerifyError
from circle_fx.cli import main
from circle_fx.model import CircleModel
from llm_models import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    d = tmp_path_factory.mktemp("guard")
    return circle_fx.export_llm(tiny("llama"), max_seq_len=16, prefill_len=4).save(str(d / "pkg"))


def plain_llama():
    model = tiny("llama")
    model.config.use_cache = False
    return model


def truncated_copy(package, tmp_path, part="model.circle", keep=1 / 3) -> str:
    bad = str(tmp_path / "bad")
    shutil.copytree(package, bad)
    path = os.path.join(bad, part)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:int(len(data) * keep)])
    return bad


def test_load_runs_an_existing_file_like_the_export(tmp_path):
    model = plain_llama()
    ids = torch.randint(0, 128, (1, 6))
    cm = circle_fx.export(model, (ids,))
    path = cm.save(str(tmp_path / "m.circle"))
    loaded = CircleModel.load(path)
    assert loaded.builder.input_names == ["input_ids"] and loaded.builder.output_names == ["logits"]
    (got,) = loaded.run(ids)
    with torch.no_grad():
        want = model(ids).logits.numpy()
    assert np.abs(got - want).max() < 1e-4
    assert loaded.op_histogram() == cm.op_histogram()
    assert loaded.to_bytes() == cm.to_bytes()
    assert "RMS_NORM" in loaded.summary()
    loaded.save(str(tmp_path / "copy.circle"))
    assert open(tmp_path / "copy.circle", "rb").read() == cm.to_bytes()


def test_load_refuses_a_corrupt_file_naming_it(tmp_path):
    cm = circle_fx.export(plain_llama(), (torch.randint(0, 128, (1, 4)),))
    data = bytearray(cm.to_bytes())
    path = str(tmp_path / "broken.circle")
    for cut in (len(data) // 3, 7):
        with open(path, "wb") as f:
            f.write(data[:cut])
        with pytest.raises(VerifyError, match="broken.circle"):
            CircleModel.load(path)


def test_truncated_decode_file_is_an_error_not_a_crash(package, tmp_path):
    """In a subprocess: before the guard, this killed the interpreter with SIGSEGV."""
    bad = truncated_copy(package, tmp_path)
    code = ("import circle_fx\nfrom circle_fx.llm import LLMRunner\n"
            "try:\n    LLMRunner(%r).generate([1, 2, 3], 4)\n"
            "except circle_fx.VerifyError as e:\n    print('VerifyError:', e)\n    raise SystemExit(3)\n" % bad)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 3, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    assert "model.circle" in r.stdout and "refusing to load" in r.stdout


def test_cli_generate_names_the_corrupt_file(package, tmp_path, capsys):
    part = "model.circle"
    bad = truncated_copy(package, tmp_path, part)
    assert main(["generate", bad, "--prompt-ids", "1,2,3", "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert part in err and "Traceback" not in err


def test_cli_inspect_names_the_corrupt_file(package, tmp_path, capsys):
    bad = truncated_copy(package, tmp_path, keep=0.5)
    assert main(["inspect", os.path.join(bad, "model.circle")]) == 1
    err = capsys.readouterr().err
    assert "model.circle" in err and "Traceback" not in err
