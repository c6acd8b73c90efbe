"""The decompose passes: what the emitter cannot take as captured, rewritten into what it can.

Four named passes, in this order at the head of the default pipeline (and again, nothing
deferred, in ``finalize_pipeline``); users edit the pipeline by these names:

- ``decompose_composites`` (:class:`DecomposeComposites`): composite aten ops onto a fusion
  family's op. ``torch.nn.RMSNorm`` / ``F.rms_norm`` export as one ``aten.rms_norm.default``
  node, not as the ``pow -> mean -> rsqrt`` chain the fusion patterns look for; the family
  that owns the Circle op owns the mapping (``FusionFamily.composites``; for RMSNorm see
  ``circle_fx/fusions/rms_norm.py``). A mapping that produces the family's op is a fusion
  like any other: recorded in the program's fusion log (with the composite's source line).
- ``rewrite_indexing`` (:data:`INDEXING_RULES`, applied by :class:`~circle_fx.patterns.RewriteRules`): indexing forms that need the graph around
  the node, owned by no fusion family, as pattern rules with named checks (multi-tensor
  indexing -> one flat GATHER, per-row dispatch through a mask -> a select, a gather from a
  constant of one value -> that value); ``explain`` reports the rules' near misses.
- ``complex_to_real``: complex arithmetic and DFTs as real pairs (:mod:`.complex_to_real`).
- ``decompose``: the general fallback, every op left without a lowering decomposed into
  ops with one (:mod:`.decompose_unlowered`); ``defer`` keeps the approximate ones for
  ``finalize_pipeline`` so fusions see the exact op first.
"""
from __future__ import annotations

import torch.fx as fx

from ..fusion_log import FusionRecord
from ..fusions import composite_rules
from ..op_traits import APPROXIMATED
from ..pass_protocol import Pass
from ..patterns import RewriteRules
from ..source import source_line
from .flat_index import FLAT_INDEX
from .masked_rows import MASKED_ROWS
from .uniform_gather import UNIFORM_GATHER

#: the rewrites owned by no fusion family: ``aten.index`` with several index tensors,
#: ``index_put`` through a boolean mask, ``gather`` from a constant of one value
INDEXING_RULES = [FLAT_INDEX, MASKED_ROWS, UNIFORM_GATHER]


def rewrite_indexing(record_failures: bool = False) -> RewriteRules:
    """The ``rewrite_indexing`` pass (``record_failures``: keep near misses for ``explain``)."""
    return RewriteRules(INDEXING_RULES, name="rewrite_indexing", record_failures=record_failures)


class DecomposeComposites(Pass):
    """Replace composite ops (``aten.rms_norm``, ``aten.batch_norm``) by their family's
    mapping: the family's op or primitive aten ops."""

    name = "decompose_composites"

    def run(self, program) -> bool:
        g = program.gm.graph
        rules = composite_rules()
        changed = False
        for n in list(g.nodes):
            owner = rules.get(n.target) if n.op == "call_function" else None
            if owner is None:
                continue
            family, rule = owner
            with g.inserting_before(n):
                new = rule(n, g)
            if new is None:
                continue
            if family.op is not None and isinstance(new, fx.Node) and new.target is family.op:
                program.fusion_log.applied[new.name] = FusionRecord(
                    family.name, new.name, [_op_name(n.target)], source_line(n), 1)
            n.replace_all_uses_with(new)
            g.erase_node(n)
            changed = True
        return changed


class ComplexToReal(Pass):
    """Complex arithmetic and Fourier transforms as real arithmetic (see :mod:`.complex_to_real`)."""

    name = "complex_to_real"

    def run(self, program) -> bool:
        from .complex_to_real import complex_to_real

        return complex_to_real(program)


class DecomposeUnlowered(Pass):
    """Decompose every op that has no lowering into ops that do (when possible).

    ``defer``: ops left alone here (by default the approximate decompositions,
    ``op_traits.APPROXIMATED``, so fusions see the exact op first);
    ``finalize_pipeline`` passes none, so they are decomposed before emission."""

    name = "decompose"

    def __init__(self, defer=None) -> None:
        super().__init__()
        self.defer = APPROXIMATED if defer is None else frozenset(defer)

    def run(self, program) -> bool:
        from .decompose_unlowered import decompose_unlowered

        return decompose_unlowered(program, defer=self.defer)


def decompose_passes(defer=None, record_failures: bool = False) -> list[Pass]:
    """The four decompose passes, in pipeline order (``defer`` as for :class:`DecomposeUnlowered`;
    ``record_failures``: ``rewrite_indexing`` keeps its near misses for ``explain``)."""
    return [DecomposeComposites(), rewrite_indexing(record_failures), ComplexToReal(), DecomposeUnlowered(defer)]


def _op_name(target) -> str:
    """``aten.rms_norm`` for the record's rule list (what the user's code called)."""
    return str(target).rsplit(".", 1)[0] if str(target).endswith(".default") else str(target)
