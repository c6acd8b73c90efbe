"""The ``circle-fx`` command line (``export``, ``inspect``, ``explain``) and its errors.

Most tests call :func:`circle_fx.cli.main` in-process (fast); two run the installed
console script and ``python -m circle_fx`` for real, to check the entry points and that
errors reach the user as one line on stderr with exit code 1 and no traceback.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx.cli import main
from circle_fx.circle.reader import read_circle

MODELS = textwrap.dedent('''
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.norm = torch.nn.RMSNorm(16, eps=1e-6)
            self.fc = torch.nn.Linear(16, 24)

        def forward(self, x):
            return self.fc(self.norm(x))

    def build():
        return Block(), (torch.randn(2, 5, 16),)

    class Unsupported(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            y = torch.cumprod(self.fc(x), dim=-1)
            z = torch.sort(y, dim=-1).values
            return z + torch.cumprod(x, dim=1)

    def unsupported():
        return Unsupported(), (torch.randn(2, 8),)

    def not_a_pair():
        return Block()

    def raises():
        raise RuntimeError("factory is broken")

    NOT_CALLABLE = 3

    class NormOverAxis1(torch.nn.Module):
        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-6)

    def near_miss():
        return NormOverAxis1(), (torch.randn(2, 5, 16),)
''')


NEAR_MISS_LINE = "return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-6)"


def line_of(code: str) -> int:
    """1-based line number of ``code`` in MODELS (as written to my_models.py)."""
    (n,) = [i for i, line in enumerate(MODELS.splitlines(), 1) if line.strip() == code]
    return n


@pytest.fixture
def models_py(tmp_path):
    path = tmp_path / "my_models.py"
    path.write_text(MODELS)
    return path


def run_cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------------------ export

def test_export_from_a_py_file(capsys, models_py, tmp_path):
    out_path = tmp_path / "block.circle"
    rc, out, err = run_cli(capsys, "export", f"{models_py}:build", "-o", out_path, "--summary")
    assert rc == 0, err
    assert f"wrote {out_path}" in out and "circle_fx model summary" in out
    cf = read_circle(out_path)
    assert sorted(op.name for op in cf.operators) == ["FULLY_CONNECTED", "RESHAPE", "RMS_NORM"]
    # the file is the model: run it and compare with eager
    spec = importlib.util.spec_from_file_location("models_for_check", models_py)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model, (x,) = mod.build()
    from circle_fx.circle.runtime import OnertSession

    (got,) = OnertSession(str(out_path)).run([x.numpy()])
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=0, atol=1e-5)


def test_export_from_a_dotted_module_with_check(capsys, tmp_path):
    out_path = tmp_path / "tiny.circle"
    rc, out, err = run_cli(capsys, "export", "circle_fx.demo:tiny_llama", "-o", out_path, "--check")
    assert rc == 0, err
    assert "5 fusions" in out
    diff = float(out.split("max abs diff")[1].split()[0])
    assert 0 <= diff <= 1e-4
    hist = {}
    for op in read_circle(out_path).operators:
        hist[op.name] = hist.get(op.name, 0) + 1
    assert hist["RMS_NORM"] == 5


def test_export_no_fuse(capsys, models_py, tmp_path):
    """``aten.rms_norm`` still lowers without passes (the decompose step always runs)."""
    out_path = tmp_path / "nofuse.circle"
    rc, out, err = run_cli(capsys, "export", f"{models_py}:build", "-o", out_path, "--no-fuse")
    assert rc == 0, err
    assert [op.name for op in read_circle(out_path).operators].count("RMS_NORM") == 1


def test_check_failure_writes_nothing(capsys, models_py, tmp_path, monkeypatch):
    out_path = tmp_path / "bad.circle"
    real_run = circle_fx.CircleModel.run
    monkeypatch.setattr(circle_fx.CircleModel, "run", lambda self, *a: [o + 1.0 for o in real_run(self, *a)])
    rc, out, err = run_cli(capsys, "export", f"{models_py}:build", "-o", out_path, "--check")
    assert rc == 1
    assert "differs from torch eager" in err and "nothing was written" in err
    assert os.listdir(tmp_path) == ["my_models.py"]


def test_unsupported_ops_listed_with_sources_and_no_file(capsys, models_py, tmp_path):
    out_path = tmp_path / "unsupported.circle"
    rc, out, err = run_cli(capsys, "export", f"{models_py}:unsupported", "-o", out_path)
    assert rc == 1
    assert "Traceback" not in err
    assert "2 unsupported op(s), 3 node(s)" in err
    assert "aten.cumprod.default" in err and "aten.sort.default" in err
    # each use is reported with its source line in the user's file
    for code in ("y = torch.cumprod(self.fc(x), dim=-1)", "z = torch.sort(y, dim=-1).values",
                 "return z + torch.cumprod(x, dim=1)"):
        assert f"my_models.py:{line_of(code)} (forward): {code}" in err
    assert os.listdir(tmp_path) == ["my_models.py"]  # no output, no temp file


def test_unsupported_ops_api_error_lists_every_op(models_py):
    spec = importlib.util.spec_from_file_location("models_for_api", models_py)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model, inputs = mod.unsupported()
    with pytest.raises(circle_fx.UnsupportedOpError) as info:
        circle_fx.export(model, inputs)
    ops = info.value.ops
    assert sorted(op for op, _, _ in ops) == ["aten.cumprod.default", "aten.cumprod.default", "aten.sort.default"]
    assert all("my_models.py:" in src for _, _, src in ops)


@pytest.mark.parametrize("spec, message", [
    ("no_colon_here", "expected MODULE:FACTORY"),
    ("no_such_module_xyz:build", "no module named 'no_such_module_xyz'"),
    ("{models}:missing", "has no attribute 'missing'"),
    ("{models}:NOT_CALLABLE", "is not callable"),
    ("{models}:not_a_pair", "must return (model, example_inputs)"),
    ("{models}:raises", "RuntimeError: factory is broken"),
    ("{dir}/absent.py:build", "no such file"),
])
def test_bad_model_specs_are_one_line_errors(capsys, models_py, tmp_path, spec, message):
    spec = spec.format(models=models_py, dir=tmp_path)
    rc, out, err = run_cli(capsys, "export", spec, "-o", tmp_path / "x.circle")
    assert rc == 1
    assert message in err and err.startswith("circle-fx export: error:")
    assert not (tmp_path / "x.circle").exists()


def test_output_name_must_end_in_circle(capsys, models_py, tmp_path):
    rc, out, err = run_cli(capsys, "export", f"{models_py}:build", "-o", tmp_path / "x.tflite")
    assert rc == 1 and "must end in .circle" in err
    assert not (tmp_path / "x.tflite").exists()


def test_traceback_flag_reraises(models_py, tmp_path):
    with pytest.raises(circle_fx.UnsupportedOpError):
        main(["--traceback", "export", f"{models_py}:unsupported", "-o", str(tmp_path / "u.circle")])


# ----------------------------------------------------------------------------- inspect

@pytest.fixture
def llama_file(tmp_path, tiny_llama_circle):
    return tiny_llama_circle.save(tmp_path / "llama.circle")


def test_inspect_prints_operators_tensors_buffers(capsys, llama_file, tiny_llama_circle):
    rc, out, err = run_cli(capsys, "inspect", llama_file)
    assert rc == 0, err
    for heading in ("Operators (", "Tensors (", "Buffers ("):
        assert heading in out
    lines = out.splitlines()
    n_ops = len(tiny_llama_circle.builder.operators)
    assert f"Operators ({n_ops})" in out
    assert f"operators: {n_ops}" in out
    assert "inputs : input_ids[1,8]" in out and "outputs: logits[1,8,128]" in out
    # one row per operator, with names of its tensors and decoded options
    rows = [l for l in lines if l.split() and l.split()[0].isdigit()]
    rms_rows = [l for l in rows if l.split()[1] == "RMS_NORM"]
    assert len(rms_rows) == 5 and all("epsilon=1e-06" in r for r in rms_rows)
    assert any("FULLY_CONNECTED" in l and "lm_head_weight" in l for l in lines)
    # tensors: names, types, shapes and buffer sizes
    assert any("model_embed_tokens_weight" in l and "FLOAT32" in l and "[128,32]" in l and "16,384" in l
               for l in lines)
    # buffers: where the data is and which tensors use it
    assert any(l.split()[1:3] == ["16,384", "inline"] and "model_embed_tokens_weight" in l for l in rows)


def test_inspect_only_one_table(capsys, llama_file):
    rc, out, err = run_cli(capsys, "inspect", llama_file, "--only", "tensors")
    assert rc == 0
    assert "Tensors (" in out and "Operators (" not in out and "Buffers (" not in out


def test_inspect_rejects_non_circle_files(capsys, models_py, tmp_path):
    rc, out, err = run_cli(capsys, "inspect", models_py)
    assert rc == 1 and "not a Circle file" in err
    rc, out, err = run_cli(capsys, "inspect", tmp_path / "missing.circle")
    assert rc == 1 and "no such file" in err


# ----------------------------------------------------------------------------- explain

def test_explain_reports_the_fusions(capsys):
    rc, out, err = run_cli(capsys, "explain", "circle_fx.demo:tiny_llama")
    assert rc == 0, err
    assert "fused: 5" in out and "not fused: 0" in out
    assert out.count("modeling_llama.py:") == 5


def test_explain_names_the_near_miss_and_its_line(capsys, models_py):
    rc, out, err = run_cli(capsys, "explain", f"{models_py}:near_miss")
    assert rc == 0, err
    assert "fused: 0" in out and "not fused: 1" in out
    assert f"my_models.py:{line_of(NEAR_MISS_LINE)}" in out
    assert "axis" in out  # the failed condition: the mean is not over the last axis


def test_explain_bad_spec(capsys):
    rc, out, err = run_cli(capsys, "explain", "nothing_here_xyz:f")
    assert rc == 1 and "no module named" in err


# ----------------------------------------------------------------- real entry points

def test_console_script_inspect(llama_file):
    exe = shutil.which("circle-fx")
    if exe is None:
        pytest.fail("the circle-fx console script is not installed: run `pip install -e .`")
    proc = subprocess.run([exe, "inspect", llama_file, "--only", "operators"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "RMS_NORM" in proc.stdout


def test_python_dash_m_error_has_no_traceback(models_py, tmp_path):
    out_path = tmp_path / "u.circle"
    proc = subprocess.run([sys.executable, "-m", "circle_fx", "export", f"{models_py}:unsupported",
                           "-o", str(out_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "aten.cumprod.default" in proc.stderr and "aten.sort.default" in proc.stderr
    assert proc.stdout == ""
    assert not out_path.exists()


# -------------------------------------------------------------------------------- demo

def test_demo_exports_runs_and_compares(capsys, tmp_path):
    from circle_fx import demo

    assert demo.main(["--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "tiny_llama.circle").exists()
    diff = float(out.split("max abs diff onert vs torch eager = ")[1].split()[0])
    assert diff <= demo.TOLERANCE
    assert "circle_fx model summary" in out and "RMS_NORM             5" in out
    assert "fusions applied: 5" in out


def test_demo_prints_no_library_noise(tmp_path):
    """`make demo` runs this: transformers imports torchao, whose import prints 'Failed to load'
    and pytree warnings; the tools drop that (circle_fx/quiet.py), so stderr stays empty."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "circle_fx.demo", "--out-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stderr == "", p.stderr
    assert "OK" in p.stdout
