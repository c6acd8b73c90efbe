"""``circle-fx export --static``: PT2E quantization from the command line prints the
quantization report, so the worst layers are visible before deployment."""
from __future__ import annotations

import textwrap

import numpy as np

from circle_fx.cli import main
from circle_fx.model import CircleModel

MODELS = textwrap.dedent('''
    import torch

    class M(torch.nn.Module):
        def __init__(self, d=16):
            super().__init__()
            torch.manual_seed(0)
            self.fc = torch.nn.Linear(d, d)
            self.fc2 = torch.nn.Linear(d, 8)
            with torch.no_grad():  # like a trained LLM, fc nearly ignores the outlier channel
                self.fc.weight[:, 0] *= 0.01

        def forward(self, x):
            return self.fc2(torch.relu(self.fc(x)))

    def build():
        return M().eval(), (torch.randn(2, 16),)

    def calibration():
        g = torch.Generator().manual_seed(0)
        outlier = torch.tensor([300.0] + [1.0] * 15)
        return [(torch.randn(2, 16, generator=g) * outlier,) for _ in range(4)]
''')


def test_static_export_names_the_worst_layer(capsys, tmp_path):
    models = tmp_path / "static_models.py"
    models.write_text(MODELS)
    out = tmp_path / "m.circle"
    assert main(["export", f"{models}:build", "-o", str(out), "--static", "--calibration",
                 f"{models}:calibration", "--report-top", "2"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    worst = lines.index("linears with the lowest SQNR against float (dB, on the given batches):")
    assert lines[worst + 1].startswith("  fc: ") and lines[worst + 2].startswith("  fc2: "), text
    assert float(lines[worst + 1].split(":")[1]) < float(lines[worst + 2].split(":")[1])
    assert "widest calibrated activation ranges:" in text
    # the file computes what the same flow's fake-quant model computes (a few output steps)
    import importlib.util

    import torch

    from circle_fx.quant.static_flow import quantize_static

    spec = importlib.util.spec_from_file_location("static_models_ref", models)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model, inputs = mod.build()
    converted, _ = quantize_static(model, inputs, mod.calibration())
    x = mod.calibration()[0][0]
    (y,) = CircleModel.load(str(out)).run(x.numpy())
    with torch.no_grad():
        ref = converted(x).numpy()
    step = (ref.max() - ref.min()) / 255
    assert y.shape == ref.shape and np.abs(y - ref).max() <= 3 * step


def test_static_and_weight_only_are_exclusive(capsys, tmp_path):
    models = tmp_path / "static_models2.py"
    models.write_text(MODELS)
    assert main(["export", f"{models}:build", "-o", str(tmp_path / "m.circle"), "--static",
                 "--quantize", "int8-weights"]) != 0
    assert "--static" in capsys.readouterr().err
