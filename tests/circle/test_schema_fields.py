"""``safe_read.fields`` reads each table's layout from circle_schema's generated code; every
scalar's default must be what the generated accessor returns for an absent field."""
from __future__ import annotations

import importlib

import flatbuffers
import pytest

from circle_fx.circle.safe_read import _PKG, fields

TABLES = ["DepthwiseConv2DOptions", "Conv2DOptions", "UniqueOptions", "Tensor", "Operator", "FullyConnectedOptions",
          "QuantizationParameters", "Model", "SubGraph", "Buffer", "OperatorCode", "Metadata"]


@pytest.mark.parametrize("table", TABLES)
def test_scalar_defaults_are_the_accessors(table):
    b = flatbuffers.Builder(0)
    b.StartObject(0)
    b.Finish(b.EndObject())
    cls = getattr(importlib.import_module(f"{_PKG}.{table}"), table)
    obj = cls()
    obj.Init(b.Output(), flatbuffers.encode.Get(flatbuffers.packer.uoffset, b.Output(), 0))
    scalars = {n: f.default for n, f in fields(table).items() if f.kind == "scalar"}
    assert scalars or table in ("Model", "SubGraph", "Buffer", "Metadata", "QuantizationParameters")
    for name, default in scalars.items():
        assert getattr(obj, name)() == default, (table, name)
