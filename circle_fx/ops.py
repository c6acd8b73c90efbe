"""Torch custom ops for Circle-only operators (``torch.ops.circle.*``): how they are defined.

Each op is defined by its owner (a fusion family defines the op its rules produce, the
quantizer its quantized ops) with :func:`define`: a schema, a real eager kernel and a fake
(meta) kernel, so a fused FX graph still runs in PyTorch, can be compared numerically with
the graph it came from, and shape propagation keeps working.
"""
from __future__ import annotations

from typing import Callable

import torch

NAMESPACE = "circle"
_lib = torch.library.Library(NAMESPACE, "FRAGMENT")  # noqa: keep a reference for the process lifetime


def define(schema: str, eager: Callable, fake: Callable):
    """Define ``torch.ops.circle.<name>`` from ``schema`` (``"name(Tensor x, ...) -> Tensor"``)
    with its eager and fake kernels; returns the op's default overload."""
    name = schema.split("(", 1)[0].strip()
    _lib.define(schema)
    _lib.impl(name, eager, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_lib)
    return getattr(torch.ops.circle, name).default
