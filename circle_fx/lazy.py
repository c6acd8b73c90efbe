"""Constants whose values are read only when needed: weights streamed from a checkpoint.

A :class:`LazyTensor` stands in a :class:`~circle_fx.program.Program` for a weight of a
checkpoint (``export_llm`` of a ``save_pretrained`` directory or a ``.gguf`` file): it has the
weight's shape and dtype and a *thunk* that reads its values (safetensors through a memory
map, a GGUF tensor dequantized on its own). Nothing holds the values: each read is a fresh
tensor the caller drops when done, so a conversion holds one float weight at a time.

Every torch operation on a lazy constant is deferred too (``__torch_dispatch__``): its result
is another LazyTensor whose thunk applies the operation to the inputs' values, its shape
computed on the meta device. So the passes that compute on weights — constant folding
(a transposed or ``1 + w`` gamma), merged q/k/v and gate/up weights (``StackedTensor`` parts
stay lazy), a tied embedding read twice — need no change and read nothing; the values are
read where they are consumed: the weight quantizers (``quant/ggml.py``, ``quant/weight_only.py``
call :func:`materialize` part by part) and the writer (float constants, through
:class:`~circle_fx.emit.builder.Stacked`-like lazy buffers).

An operation whose *result* is not a tensor (``item``, ``equal``, ``is_nonzero``: a pass
asking about the values) cannot be deferred: it reads its inputs there and then. Such reads
are recorded in :data:`READS` (``(op, tensor shape)``), so a test can state which passes read
weights at conversion time and that none reads a big one.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_map

#: ``(op name, shape)`` of every lazy tensor read because an op needed its values (not a tensor
#: result); the quantizers' and writer's reads are not counted (they are the intended ones)
READS: list[tuple[str, tuple]] = []

_aten = torch.ops.aten
#: ops that keep the values as they are (a new handle on the same thunk)
_SAME = (_aten.detach.default, _aten.alias.default, _aten.clone.default, _aten.lift_fresh.default,
         _aten.lift_fresh_copy.default)


class LazyTensor(torch.Tensor):
    """A constant of ``shape``/``dtype`` whose values ``thunk()`` returns on demand.

    ``name`` is where the values come from (``"file.safetensors: model.layers.0.mlp.up_proj.weight"``)
    for messages; ``rows(start, stop)``, when given, reads a slice of rows without the rest
    (a safetensors slice): the packers then never hold a whole float weight."""

    @staticmethod
    def __new__(cls, shape, dtype, thunk, name: str = "", rows=None, key=None):
        t = torch.Tensor._make_wrapper_subclass(cls, tuple(int(d) for d in shape), dtype=dtype, device="cpu")
        t.thunk, t.source, t.rows = thunk, name, rows
        #: what the values are, the same for the same checkpoint tensor and the same ops on it in
        #: another capture (export_llm's decode and prefill programs): the quantizers' cache key
        t.key = key if key is not None else ("lazy", id(t))
        return t

    def __init__(self, *args, **kwargs):
        super().__init__()

    def materialize(self) -> torch.Tensor:
        value = self.thunk()
        if tuple(value.shape) != tuple(self.shape) or value.dtype != self.dtype:
            from .errors import InputError

            raise InputError(f"{self.source or 'a lazy constant'}: read {list(value.shape)} {value.dtype}, "
                             f"expected {list(self.shape)} {self.dtype}")
        return value

    def numpy(self, *args, **kwargs):  # a consumer that wants the values (a lowering's constant)
        return self.materialize().numpy(*args, **kwargs)

    def __repr__(self) -> str:  # noqa: D105
        return f"LazyTensor({list(self.shape)}, {self.dtype}, {self.source!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        this = args[0] if args else None
        if func in _SAME and isinstance(this, LazyTensor):
            return LazyTensor(this.shape, this.dtype, this.thunk, this.source, this.rows, this.key)

        def on_meta(x):
            if isinstance(x, LazyTensor):
                return torch.empty(x.shape, dtype=x.dtype, device="meta")
            return x.to("meta") if isinstance(x, torch.Tensor) else x

        try:
            out = func(*tree_map(on_meta, args), **tree_map(on_meta, kwargs))
        except (NotImplementedError, RuntimeError):  # no meta kernel: compute it now
            out = None
        leaves, _ = tree_flatten(out)
        if out is None or not leaves or not all(isinstance(v, torch.Tensor) for v in leaves):
            for x in tree_flatten((args, kwargs))[0]:
                if isinstance(x, LazyTensor):
                    READS.append((str(func), tuple(x.shape)))
            return func(*tree_map(materialize, args), **tree_map(materialize, kwargs))

        def compute():
            return func(*tree_map(materialize, args), **tree_map(materialize, kwargs))

        where = next((x.source for x in tree_flatten(args)[0] if isinstance(x, LazyTensor)), "")
        key = (str(func), _key((args, kwargs)))
        if isinstance(out, torch.Tensor):
            return LazyTensor(out.shape, out.dtype, compute, where, key=key)
        return type(out)(LazyTensor(v.shape, v.dtype, (lambda i=i: compute()[i]), where, key=(key, i))
                         for i, v in enumerate(out))


def _key(tree):
    """A hashable description of an op's arguments: lazy inputs by their key, other tensors by
    their storage (the same constant of the same model), the rest as they are."""
    def one(x):
        if isinstance(x, LazyTensor):
            return x.key
        if isinstance(x, torch.Tensor):
            return ("tensor", x.untyped_storage().data_ptr(), x.storage_offset(), tuple(x.shape), tuple(x.stride()))
        if isinstance(x, (list, tuple)):
            return tuple(one(v) for v in x)
        if isinstance(x, dict):
            return tuple(sorted((k, one(v)) for k, v in x.items()))
        return repr(x)
    return one(tree)


def materialize(x):
    """``x``'s values if it is a :class:`LazyTensor` (a fresh tensor), else ``x``."""
    return x.materialize() if isinstance(x, LazyTensor) else x


def is_lazy(x) -> bool:
    return isinstance(x, LazyTensor)
