"""circle_fx.circle: the artifact side (schema facts, reader, verify, inspect, runtime).

It describes Circle files and must not depend on the model stack, and the quantization
slot must carry parameters from FX ``node.meta`` to the file and back.
"""
from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx.circle import schema
from circle_fx.circle.inspect import format_circle
from circle_fx.circle.reader import read_circle
from circle_fx.circle.schema import BO, QuantParams
from circle_fx.meta import QUANT_META

PKG = pathlib.Path(circle_fx.__file__).parent / "circle"


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            out.add("." * node.level + mod)
    return out


@pytest.mark.parametrize("path", sorted(PKG.glob("*.py")), ids=lambda p: p.name)
def test_artifact_modules_import_neither_torch_nor_emit(path):
    for mod in _imports(path):
        assert not mod.split(".")[0] == "torch", f"{path.name} imports {mod}"
        # inside circle_fx only the package itself and errors.py are allowed
        if mod.startswith(".."):
            assert mod == "..errors", f"{path.name} imports {mod}"
        assert not mod.startswith("circle_fx.") or mod.startswith("circle_fx.circle"), f"{path.name} imports {mod}"


@pytest.mark.parametrize("op,expected", [
    ("ADD", "AddOptions"), ("MEAN", "ReducerOptions"), ("SUM", "ReducerOptions"),
    ("ROPE", "RoPEOptions"), ("RMS_NORM", "RmsNormOptions"), ("BATCH_MATMUL", "BatchMatMulOptions"),
    ("SELECT_V2", "SelectV2Options"), ("CONV_2D", "Conv2DOptions"), ("MAXIMUM", "MaximumMinimumOptions"),
    ("RESHAPE", None), ("CAST", None), ("RSQRT", None),
])
def test_options_table_lookup_handles_irregular_names(op, expected):
    assert schema.options_class_name(getattr(BO, op)) == expected
    if expected is not None:
        assert type(schema.default_options(getattr(BO, op))).__name__ == expected + "T"


def test_make_options_rejects_misspelled_fields():
    assert schema.make_options("RmsNormOptions", epsilon=1e-5).epsilon == 1e-5
    with pytest.raises(AttributeError, match="adjX"):
        schema.make_options("BatchMatMulOptions", adjX=True)


def test_op_and_type_names():
    assert schema.op_name(BO.RMS_NORM) == "RMS_NORM" and BO.RMS_NORM < 0
    assert schema.op_name(123456) == "123456"
    assert schema.type_name(schema.TT.UINT8) == "UINT8"


def test_quant_params_validate_and_describe():
    q = QuantParams([0.5, 0.25], [0, 0], axis=0)
    assert q.per_channel and q.scale == (0.5, 0.25) and "2 scales" in q.describe()
    assert "scale=0.1" in QuantParams(0.1, 128).describe()
    with pytest.raises(ValueError):
        QuantParams([1.0, 2.0], [0])


class _Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4, bias=False)

    def forward(self, x):
        return self.fc(x) + 1.0


def _tag(per_tensor: QuantParams, per_channel: QuantParams):
    """A user pass that attaches quantization to the weight constant and the linear's result."""

    def tag_quant(program) -> bool:
        for n in program.graph.nodes:
            if n.op == "get_attr" and tuple(program.constant(n).shape) == (4, 8):
                n.meta[QUANT_META] = per_channel
            if n.op == "call_function" and "linear" in str(n.target):
                n.meta[QUANT_META] = per_tensor
        return False

    return tag_quant


def test_quantization_slot_round_trips_from_node_meta_to_file():
    per_tensor = QuantParams(0.05, 128)
    per_channel = QuantParams([0.1, 0.2, 0.3, 0.4], [0, 0, 0, 0], axis=0)
    pipeline = circle_fx.default_pipeline()
    pipeline.append(_tag(per_tensor, per_channel))
    # the tags land on FLOAT32 tensors, which verify rejects (quantized tensors are integer-typed;
    # checked at the end), so lower without verifying
    program = circle_fx.capture(_Linear().eval(), (torch.randn(2, 8),))
    cm = circle_fx.lower(program, passes=pipeline, verify=False)
    cf = read_circle(cm.to_bytes())
    quantized = {t.name: t for t in cf.tensors if t.quantization is not None}
    weights = [t for t in quantized.values() if t.shape == [4, 8]]
    assert len(weights) == 1 and weights[0].quantization == per_channel
    outs = [t for t in quantized.values() if t.shape != [4, 8]]
    assert len(outs) == 1 and outs[0].quantization == per_tensor
    assert outs[0].type_name == "FLOAT32"  # the slot carries parameters; lowerings pick storage types
    # every other tensor stays unquantized
    assert len(quantized) == 2
    text = format_circle(cf, sections=("tensors",))
    assert "scale=0.05 zp=128" in text and "per-channel axis=0 (4 scales 0.1..0.4, zp=0)" in text
    with pytest.raises(circle_fx.VerifyError) as e:
        circle_fx.verify(cm.to_bytes())
    assert len(e.value.problems) == 2 and all("FLOAT32 tensor carries quantization" in p for p in e.value.problems)


def test_unquantized_models_carry_no_quantization(tiny_llama):
    model, inputs = tiny_llama
    cf = read_circle(circle_fx.export(model, inputs, verbose=False).to_bytes())
    assert all(t.quantization is None for t in cf.tensors)
    assert np.isfinite(cf.file_size)
