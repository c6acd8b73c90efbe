"""One Circle file with several entry points (an LLM package's ``model.circle``: prefill, decode).

The layout ONE's LLM runner reads (Samsung/ONE ``tools/o2o/merge.circles.py``): one subgraph
per entry point, a SignatureDef per entry point keyed by its name, every distinct constant
buffer stored once however many subgraphs read it. onert 0.1.0 ignores SignatureDefs and always
runs subgraph 0, so subgraph 0 here is a *dispatch* graph: one IF on a bool ``[1]`` input that
runs the first entry point (its "then" branch) or the second (its "else" branch). Measured
(docs/probes/if_entry_points.py, docs/onert-findings.md "One session, every entry point"):

- constants read from both branches are held once per session, and both branches are exact;
- an IF output is sized by the *then* branch; an else branch with a smaller output writes it into
  the first bytes (the rest is left as it was). So the IF has one output slot per output of each
  entry point: the then branch fills the else branch's slots with small zero constants of the
  else branch's own shapes (which sizes them exactly), the else branch fills the then branch's
  slots with one-element zeros. A host reads only the slots of the entry point it ran, and a
  decode step copies no prefill-sized tensor;
- the main graph's inputs are every entry point's inputs (each branch takes all of them and
  reads its own): inputs of different shapes never meet, so no dynamic shape is needed;
- a dynamic-length ([1,-1]) input into IF fails at run in onert 0.1.0 ("num_elements() cannot
  calculate when any dimension is unspecified").

Names: the main graph's inputs and outputs are ``<entry>.<name>`` (``prefill.input_ids``,
``decode.logits``), its bool input ``entry``; the branch subgraphs keep their own names.
"""
from __future__ import annotations

import hashlib

import json
from dataclasses import dataclass, field, replace

import numpy as np
from circle_schema import circle

from ..circle.dedup import duplicates
from ..circle.schema import BO, CIRCLE_TO_NUMPY, TT
from .builder import LazyParts, ModelBuilder, OperatorInfo, Stacked, TensorInfo
from .index_limits import LIMITS_METADATA

#: the main graph's bool input: True runs the first entry point, False the second
ENTRY_INPUT = "entry"


@dataclass
class EntryGraph:
    """One branch subgraph: what :func:`~circle_fx.emit.writer.serialize` writes after subgraph 0."""

    name: str
    tensors: list
    operators: list
    inputs: list
    outputs: list
    input_names: list
    output_names: list


@dataclass
class DispatchBuilder(ModelBuilder):
    """Subgraph 0 (the IF dispatch) plus :attr:`subgraphs`, all over one buffer list."""

    subgraphs: list = field(default_factory=list)
    main_signature: str = "dispatch"


def _key(buf):
    """Identity of a lazily stacked weight (merged q/k/v): the arrays it stacks. Two entry points
    that merged the same weights hold the same arrays (export_llm shares its weight cache); a
    checkpoint weight not yet read (:class:`~circle_fx.emit.builder.LazyParts`) by the digest of
    its bytes, streamed one part at a time: the two entry points reach the same checkpoint tensor
    through different ops (prefill's 1x1 CONV_2D filter is decode's FC weight reshaped), so their
    lazy keys differ where their bytes do not. A 256-bit digest: no pair of distinct weights is
    expected to collide, and reading them again to compare would double the checkpoint reads."""
    if isinstance(buf, LazyParts):
        h = hashlib.blake2b(digest_size=32)
        for chunk in buf.chunks():
            h.update(np.ascontiguousarray(chunk).reshape(-1).view(np.uint8))
        return ("lazy", buf.nbytes, h.digest())
    return tuple((p.__array_interface__["data"][0], p.nbytes, p.dtype.str) for p in buf.parts)


def _same_memory(arr):
    """A key equal for two buffers that are the same memory (one weight array that several entry
    points read: export_llm shares its weight cache), so it is merged without hashing its bytes
    once per entry point (an LLM package with buckets has up to 8); None for anything else."""
    if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous or arr.nbytes == 0:
        return None
    return (arr.__array_interface__["data"][0], arr.nbytes, arr.dtype.str)


def _union_buffers(builders, extra: list) -> tuple[list, list[dict], list[int]]:
    """Every builder's constant buffers and the ``extra`` arrays in one list, each distinct one
    once: ``(buffers, maps, extra indices)`` with ``maps[k][old index] = new index``. Metadata
    buffers are left out (the caller writes one)."""
    flat, stacked, same = [None], {}, {}
    maps = []
    for b in builders:
        meta = set(b.metadata.values())
        m = {0: 0}
        for i, arr in enumerate(b.buffers):
            if i == 0 or i in meta:
                continue
            if arr is None:
                m[i] = 0
            elif isinstance(arr, Stacked):
                k = _key(arr)
                if k not in stacked:
                    stacked[k] = len(flat)
                    flat.append(arr)
                m[i] = stacked[k]
            else:
                k = _same_memory(arr)
                if k is not None and k in same:  # the same array read by another entry point
                    m[i] = same[k]
                    continue
                if k is not None:
                    same[k] = len(flat)
                m[i] = len(flat)
                flat.append(arr)
        maps.append(m)
    first_extra = len(flat)
    flat.extend(extra)
    dups = duplicates(flat)
    kept, renumber = [], {}
    for i, arr in enumerate(flat):
        if i not in dups:
            renumber[i] = len(kept)
            kept.append(arr)
    final = lambda i: renumber[dups.get(i, i)]  # noqa: E731
    return kept, [{old: final(new) for old, new in m.items()} for m in maps], \
        [final(first_extra + k) for k in range(len(extra))]


def _unique(name: str, taken: set) -> str:
    out, k = name, 1
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    taken.add(out)
    return out


@dataclass
class Buckets:
    """One entry point served by several builders of the same inputs and outputs (names, shapes,
    types): bucket ``k`` runs when the run-time value of input ``selector`` is below
    ``bounds[k]`` (ascending), the last one otherwise. An LLM package's decode cache-length buckets
    (selector ``position``: a step at position 100 reads 256 cache rows, not 4096) and prefill
    lengths (selector ``last_index``). In the file: a chain of subgraphs ``LESS(selector, bound)
    -> IF(then bucket k, else the rest)``, which onert 0.1.0 runs exactly (docs/onert-findings.md,
    "IF chain over cache-length buckets"); the buckets' weights are stored once like every other
    shared buffer. ``names``: each bucket's subgraph name (its SignatureDef key)."""

    selector: str
    bounds: list
    builders: list
    names: list

    @property
    def interface(self) -> ModelBuilder:
        return self.builders[-1]


class _Same(dict):
    """The buffer map of a graph already numbered in the file's buffer list."""

    def get(self, key, default=None):
        return key


def dispatch(entries: list) -> DispatchBuilder:
    """The one-file model of two entry points ``[(name, builder or Buckets), ...]``; the first
    runs when the ``entry`` input is True. The builders are not modified."""
    if len(entries) != 2:
        raise ValueError(f"dispatch takes two entry points (one IF), got {len(entries)}")
    sides = [(name, e if isinstance(e, Buckets) else Buckets("", [], [e], [name])) for name, e in entries]
    (a_name, a_b), (b_name, b_b) = sides
    a, b = a_b.interface, b_b.interface
    leaves = [*a_b.builders, *b_b.builders]
    bounds = [np.array([v], np.int32) for _, bk in sides for v in bk.bounds]
    # the zeros each branch puts in the other's output slots: the decode shapes (then branch),
    # one element (else branch); stored with the weights, so equal bytes are one buffer
    slot_shapes = [(list(b.tensors[i].shape), b.tensors[i].type) for i in b.outputs] + \
        [([1] * len(a.tensors[i].shape), a.tensors[i].type) for i in a.outputs]
    buffers, leaf_maps, extra_idx = _union_buffers(leaves, [np.zeros(sh, CIRCLE_TO_NUMPY[t]) for sh, t in slot_shapes]
                                                    + bounds)
    zero_idx, bound_idx = extra_idx[:len(slot_shapes)], extra_idx[len(slot_shapes):]
    mb = DispatchBuilder(buffers=buffers)
    zeros = {(tuple(sh), t): k for (sh, t), k in zip(slot_shapes, zero_idx)}

    def zero_buffer(shape, ttype):
        return zeros[(tuple(shape), ttype)]

    def branch(name, own, bmap, other_name, other, other_is_else):
        tensors = [replace(t, buffer=bmap.get(t.buffer, 0), shape=list(t.shape)) for t in own.tensors]
        taken = {t.name for t in tensors}
        ins, outs = list(own.inputs), list(own.outputs)
        mine_first = other_is_else  # the then branch's inputs/outputs come first
        extra_in, extra_out = [], []
        for i in other.inputs:  # the other entry point's inputs: taken, never read
            t = other.tensors[i]
            tensors.append(TensorInfo(_unique(f"{other_name}.{t.name}", taken), list(t.shape), t.type, 0,
                                      t.shape_signature, t.quantization))
            extra_in.append(len(tensors) - 1)
        ops = [replace(op, inputs=list(op.inputs), outputs=list(op.outputs)) for op in own.operators]
        for i in other.outputs:  # the other entry point's output slots: zeros
            t = other.tensors[i]
            shape = list(t.shape) if other_is_else else [1] * len(t.shape)
            tensors.append(TensorInfo(_unique(f"{other_name}.{t.name}.zero", taken), shape, t.type,
                                      zero_buffer(shape, t.type)))
            if not other_is_else:  # an else branch's constant output would resize the slot: ADD it
                tensors.append(TensorInfo(_unique(f"{other_name}.{t.name}.unused", taken), shape, t.type))
                ops.append(OperatorInfo(BO.ADD, [len(tensors) - 2, len(tensors) - 2], [len(tensors) - 1]))
            extra_out.append(len(tensors) - 1)
        in_names = list(own.input_names) + [tensors[i].name for i in extra_in]
        out_names = list(own.output_names) + [tensors[i].name for i in extra_out]
        if not mine_first:
            ins, in_names = extra_in + ins, in_names[len(own.inputs):] + in_names[:len(own.inputs)]
            outs, out_names = extra_out + outs, out_names[len(own.outputs):] + out_names[:len(own.outputs)]
        else:
            ins, outs = ins + extra_in, outs + extra_out
        return EntryGraph(name, tensors, ops, ins, outs, in_names, out_names)

    # each side: its one builder, or the root of its bucket chain (its other nodes and its
    # buckets are subgraphs 3.. after the two roots)
    extra_graphs, roots, k_leaf, k_bound = [], [], 0, 0
    for name, bk in sides:
        maps = leaf_maps[k_leaf:k_leaf + len(bk.builders)]
        k_leaf += len(bk.builders)
        if len(bk.builders) == 1:
            roots.append((bk.interface, maps[0]))
            continue
        graphs = [_leaf(n, own, m) for n, own, m in zip(bk.names, bk.builders, maps)]
        roots.append((_chain(bk, graphs, bound_idx[k_bound:k_bound + len(bk.bounds)], extra_graphs), _Same()))
        k_bound += len(bk.bounds)
    mb.subgraphs = [branch(a_name, roots[0][0], roots[0][1], b_name, b, True),
                    branch(b_name, roots[1][0], roots[1][1], a_name, a, False), *extra_graphs]

    # subgraph 0: entry (bool [1]) + every input of both -> IF -> every output slot of both
    mb.tensors.append(TensorInfo(ENTRY_INPUT, [1], TT.BOOL))
    mb.inputs, mb.input_names = [0], [ENTRY_INPUT]
    for which in ("inputs", "outputs"):
        slots, names = (mb.inputs, mb.input_names) if which == "inputs" else (mb.outputs, mb.output_names)
        for name, own in ((a_name, a), (b_name, b)):
            for i, n in zip(getattr(own, which), getattr(own, f"{which[:-1]}_names")):
                t = own.tensors[i]
                mb.tensors.append(TensorInfo(f"{name}.{n}", list(t.shape), t.type, 0, t.shape_signature,
                                             t.quantization))
                slots.append(len(mb.tensors) - 1)
                names.append(f"{name}.{n}")
    opts = circle.IfOptions.IfOptionsT()
    opts.thenSubgraphIndex, opts.elseSubgraphIndex = 1, 2
    mb.operators = [OperatorInfo(BO.IF, list(mb.inputs), list(mb.outputs), opts)]

    # limits of the main graph's inputs (each entry point's, under its prefixed name)
    limits = {"entry_points": [a_name, b_name], "inputs": {}}
    for name, own in ((a_name, a), (b_name, b)):
        lim = own.limits or {}
        limits.update({k: v for k, v in lim.items() if k != "inputs"})
        limits["inputs"].update({f"{name}.{k}": v for k, v in (lim.get("inputs") or {}).items()})
    mb.limits = limits
    data = json.dumps(limits, sort_keys=True).encode()
    mb.buffers.append(np.frombuffer(data, np.uint8).copy())
    mb.metadata[LIMITS_METADATA] = len(mb.buffers) - 1
    return mb


def _leaf(name: str, own: ModelBuilder, bmap: dict) -> EntryGraph:
    """A bucket's subgraph: ``own`` with its buffers numbered in the file's list."""
    tensors = [replace(t, buffer=bmap.get(t.buffer, 0), shape=list(t.shape)) for t in own.tensors]
    ops = [replace(op, inputs=list(op.inputs), outputs=list(op.outputs)) for op in own.operators]
    return EntryGraph(name, tensors, ops, list(own.inputs), list(own.outputs), list(own.input_names),
                      list(own.output_names))


def _chain(bk: Buckets, leaves: list, bound_buffers: list, extra: list) -> EntryGraph:
    """The chain of IF nodes choosing among ``leaves`` (see :class:`Buckets`); node 0 is returned
    (the side's root, subgraph 1 or 2), the other nodes and every leaf are appended to ``extra``,
    whose subgraph indices start at 3."""
    # subgraph indices: nodes 1..n-1 (node 0 is the root, placed by the caller), then the leaves
    first, n_nodes = 3 + len(extra), len(leaves) - 1

    def node_index(j):
        return first + j - 1

    def leaf_index(k):
        return first + n_nodes - 1 + k

    iface = bk.interface
    nodes = []
    for j in range(n_nodes):
        tensors = [TensorInfo(n, list(iface.tensors[i].shape), iface.tensors[i].type,
                              0, iface.tensors[i].shape_signature, iface.tensors[i].quantization)
                   for i, n in zip(iface.inputs, iface.input_names)]
        ins = list(range(len(tensors)))
        tensors += [TensorInfo(n, list(iface.tensors[i].shape), iface.tensors[i].type, 0,
                               iface.tensors[i].shape_signature, iface.tensors[i].quantization)
                    for i, n in zip(iface.outputs, iface.output_names)]
        outs = list(range(len(ins), len(tensors)))
        if bk.selector not in iface.input_names:
            raise ValueError(f"bucket selector {bk.selector!r} is not an input of the entry point ({iface.input_names})")
        sel = ins[iface.input_names.index(bk.selector)]
        tensors.append(TensorInfo(f"{bk.selector}.bound", [1], TT.INT32, bound_buffers[j]))
        tensors.append(TensorInfo(f"{bk.selector}.below", [1], TT.BOOL))
        less = OperatorInfo(BO.LESS, [sel, len(tensors) - 2], [len(tensors) - 1])
        opts = circle.IfOptions.IfOptionsT()
        opts.thenSubgraphIndex = leaf_index(j)
        opts.elseSubgraphIndex = leaf_index(j + 1) if j == n_nodes - 1 else node_index(j + 1)
        ops = [less, OperatorInfo(BO.IF, [len(tensors) - 1, *ins], outs, opts)]
        nodes.append(EntryGraph(f"{bk.names[j]}.chain", tensors, ops, ins, outs, list(iface.input_names),
                                list(iface.output_names)))
    extra.extend(nodes[1:])
    extra.extend(leaves)
    return nodes[0]
