"""``define`` and the registry of the ``circle::`` dialect (the package docstring says why).

Kept apart from the package ``__init__`` so the op modules (``nhwc``, ``weights``,
``quantized``) import it without importing the package that imports them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from .. import op_traits

NAMESPACE = "circle"
_lib = torch.library.Library(NAMESPACE, "FRAGMENT")  # noqa: keep a reference for the process lifetime


@dataclass(frozen=True)
class DialectOp:
    """One ``circle::`` op: its overload (the FX target), schema, traits and defining module."""

    name: str
    target: object
    schema: str
    traits: tuple
    module: str


_OPS: dict[str, DialectOp] = {}


def define(schema: str, eager: Callable, fake: Callable, traits: Iterable = ()):
    """Define ``torch.ops.circle.<name>`` from ``schema`` (``"name(Tensor x, ...) -> Tensor"``)
    with its eager and fake kernels and its op traits; returns the op's default overload."""
    name = schema.split("(", 1)[0].strip()
    if name in _OPS:
        raise ValueError(f"circle::{name} is already defined (by {_OPS[name].module})")
    traits = tuple(traits)
    _lib.define(schema)
    _lib.impl(name, eager, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_lib)
    target = getattr(torch.ops.circle, name).default
    op_traits.declare(target, traits)
    _OPS[name] = DialectOp(name, target, schema, tuple(t if isinstance(t, str) else t.name for t in traits),
                           getattr(eager, "__module__", "?"))
    return target


def ops() -> dict[str, DialectOp]:
    """Every defined ``circle::`` op by name, in definition order."""
    return dict(_OPS)
