"""Bad output paths, half-precision models, onert's own output, unnamed sources.

- An output path that cannot be written is refused *before* any conversion, by
  ``CircleModel.save`` (:class:`OutputError`) and by ``circle-fx export -o`` (exit code 1,
  one line naming the user's path, never the temp file, no traceback).
  Root ignores permission bits, so the read-only directory / read-only file cases run the
  CLI as user ``nobody`` (``setpriv``); they are skipped where that is impossible.
- A float16 / bfloat16 model is refused at export (onert 0.1.0 loads no FLOAT16 tensor), or
  exported in float32 with ``cast_to_float32=True`` (the model is restored afterwards).
- What onert prints on the C-level stdout/stderr ends up in :class:`RuntimeFailure`.
- ``explain`` names model inputs instead of ``<unknown source>``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import circle_fx
from circle_fx import CircleFxError, OutputError, RuntimeFailure, UnsupportedDtypeError
from circle_fx.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def small():
    return circle_fx.export(nn.Sequential(nn.Linear(4, 8), nn.ReLU()).eval(), (torch.randn(2, 4),))


def _bad_paths(tmp_path):
    afile = tmp_path / "a_file.txt"
    afile.write_text("x")
    (tmp_path / "adir.circle").mkdir()
    return {
        "missing directory": (tmp_path / "nope" / "m.circle", "does not exist"),
        "parent is a file": (afile / "m.circle", "is a file, not a directory"),
        "a directory": (tmp_path / "adir.circle", "is a directory"),
    }


@pytest.mark.parametrize("case", ["missing directory", "parent is a file", "a directory"])
def test_save_refuses_a_bad_path_naming_it(small, tmp_path, case):
    path, why = _bad_paths(tmp_path)[case]
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(OutputError) as info:
        small.save(path)
    assert isinstance(info.value, CircleFxError)
    message = str(info.value)
    assert str(path) in message and why in message, message
    assert ".tmp-" not in message
    assert sorted(os.listdir(tmp_path)) == before  # nothing written, no temp file


@pytest.mark.parametrize("case", ["missing directory", "parent is a file", "a directory"])
def test_cli_refuses_a_bad_path_before_converting(capsys, tmp_path, case):
    path, why = _bad_paths(tmp_path)[case]
    # the factory does not exist: an error about the *path* proves it was checked first
    rc = main(["export", "no_such_module_for_circle_fx:build", "-o", str(path)])
    out, err = capsys.readouterr()
    assert rc == 1 and out == ""
    assert str(path) in err and why in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_write_failure_during_save_names_the_users_path(small, tmp_path, monkeypatch):
    """Something the check cannot foresee (full disk, a file system refusing new files)."""
    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied", str(tmp_path / "m.circle.tmp-1"))
    monkeypatch.setattr("circle_fx.model.write_atomic", refuse)
    with pytest.raises(OutputError) as info:
        small.save(tmp_path / "m.circle")
    assert str(tmp_path / "m.circle") in str(info.value) and ".tmp-" not in str(info.value)


def _check_as_nobody(paths, cwd):
    """Run ``check_output_path`` as user ``nobody``: root ignores permission bits.

    torch lives under /root (mode 0700 here), so ``nobody`` cannot import circle_fx as a
    whole; the check's two modules (paths.py and errors.py, which import nothing else) are
    copied into a package of their own and imported from there: the same code, unprivileged.
    """
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to drop to user nobody")
    pkg = cwd / "cfx_paths_copy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("paths.py", "errors.py"):
        shutil.copy(os.path.join(REPO, "circle_fx", name), pkg / name)
    script = ("import sys\nfrom cfx_paths_copy.paths import check_output_path\n"
              "from cfx_paths_copy.errors import OutputError\n"
              "for p in sys.argv[1:]:\n"
              "    try:\n        check_output_path(p); print('OK', p)\n"
              "    except OutputError as e:\n        print('ERR', e)\n")
    proc = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                           "-c", script, *map(str, paths)], capture_output=True, text=True, timeout=60,
                          cwd=cwd, env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(cwd)})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


@pytest.fixture
def public_tmp():
    """A temp dir user nobody can reach (pytest's tmp_path lives under a 0700 directory)."""
    import tempfile

    path = tempfile.mkdtemp(prefix="circle_fx_perm_")
    os.chmod(path, 0o755)
    yield __import__("pathlib").Path(path)
    shutil.rmtree(path, ignore_errors=True)


def test_read_only_directory_and_file_as_a_normal_user(public_tmp):
    tmp_path = public_tmp
    ro_dir = tmp_path / "ro"
    ro_dir.mkdir()
    ro_file = tmp_path / "ro_file.circle"
    ro_file.write_bytes(b"keep")
    os.chmod(ro_file, 0o444)
    os.chmod(ro_dir, 0o555)
    writable = tmp_path / "rw"
    writable.mkdir()
    os.chmod(writable, 0o777)
    lines = _check_as_nobody([ro_dir / "m.circle", ro_file, writable / "m.circle"], tmp_path)
    assert lines == [f"ERR {ro_dir / 'm.circle'}: no permission to create files in directory {ro_dir}",
                     f"ERR {ro_file}: the file exists and is read-only",
                     f"OK {writable / 'm.circle'}"], lines


# ---------------------------------------------------------------------- half precision

class Half(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("shift", torch.linspace(-1, 1, 8))

    def forward(self, x):
        return torch.relu(self.lin(x) + self.shift)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_model_is_refused_with_the_remedy(dtype, tmp_path, capsys):
    model = Half().to(dtype).eval()
    x = torch.randn(2, 8, dtype=dtype)
    with pytest.raises(UnsupportedDtypeError) as info:
        circle_fx.export(model, (x,))
    message = str(info.value)
    assert "FLOAT16" in message and "cast_to_float32=True" in message and "model.float()" in message, message
    assert f"%x: {dtype} model input" in message and f"{dtype} constant 'lin_weight'" in message, message


def test_cast_to_float32_exports_runs_and_restores_the_model():
    torch.manual_seed(0)
    model = Half().half().eval()
    x = torch.randn(3, 8).half()
    params = {k: (id(p), p.dtype, p.detach().clone()) for k, p in model.named_parameters()}
    buffers = {k: (id(b), b.dtype) for k, b in model.named_buffers()}

    cm = circle_fx.export(model, (x,), cast_to_float32=True)

    assert {k: (id(p), p.dtype) for k, p in model.named_parameters()} == {k: v[:2] for k, v in params.items()}
    assert all(torch.equal(p, params[k][2]) for k, p in model.named_parameters())
    assert {k: (id(b), b.dtype) for k, b in model.named_buffers()} == buffers
    assert "cast_to_float32" in cm.summary()
    with torch.no_grad():
        ref = Half().eval()
        ref.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        want = ref(x.float()).numpy()
    out = cm.run(x.float())[0]
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    assert float(np.abs(want).max()) > 0.1


# ---------------------------------------------------------------------- onert's own output

def test_onert_printed_text_is_folded_into_runtime_failure(tmp_path, capfd):
    """A FLOAT16 file (emitted behind check_precision's back) makes onert print, then raise."""
    from circle_fx.circle.runtime import OnertSession
    from circle_fx.emit.emitter import emit
    from circle_fx.emit.writer import serialize, write_atomic

    program = circle_fx.capture(nn.Linear(4, 4).half().eval(), (torch.randn(2, 4).half(),))
    path = str(tmp_path / "half.circle")
    write_atomic(path, serialize(emit(program)))
    capfd.readouterr()
    with pytest.raises(RuntimeFailure) as info:
        OnertSession(path).run([np.zeros((2, 4), np.float16)])
    assert "onert printed:" in str(info.value) and "does not support" in str(info.value), str(info.value)
    out, err = capfd.readouterr()
    assert "nnfw" not in out + err and "does not support" not in out + err, (out, err)


def test_a_working_run_prints_nothing(small, capfd):
    capfd.readouterr()
    small.run(np.ones((2, 4), np.float32))
    small.run(np.ones((2, 4), np.float32))
    assert capfd.readouterr() == ("", "")


# ---------------------------------------------------------------------- explain

def test_explain_names_model_inputs():
    class M(nn.Module):
        def forward(self, x, y):
            return x * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)

    text = circle_fx.explain(M(), (torch.randn(2, 3, 8), torch.randn(2, 3, 8))).format()
    assert "<unknown source>" not in text, text
    assert "model input 'y'" in text, text


HALF_PY = '''
import torch
from torch import nn

def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU()).half().eval(), (torch.randn(2, 4).half(),)
'''


def test_cli_half_model_refused_or_cast_with_the_flag(capsys, tmp_path):
    factory = tmp_path / "half_models.py"
    factory.write_text(HALF_PY)
    out_path = tmp_path / "h.circle"
    rc = main(["export", f"{factory}:build", "-o", str(out_path)])
    out, err = capsys.readouterr()
    assert rc == 1 and "FLOAT16" in err and "Traceback" not in err and not out_path.exists(), err
    rc = main(["export", f"{factory}:build", "-o", str(out_path), "--cast-to-float32", "--summary"])
    out, err = capsys.readouterr()
    assert rc == 0 and out_path.exists() and "cast_to_float32" in out, (out, err)
    from circle_fx.circle.reader import read_circle

    types = {t.type for t in read_circle(str(out_path)).tensors}
    assert 0 in types and 1 not in types, types  # circle TensorType: 0 FLOAT32, 1 FLOAT16
