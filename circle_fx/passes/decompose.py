"""Rewrite composite aten ops into what the emitter knows, using the fusion families' mappings.

``torch.nn.RMSNorm`` / ``F.rms_norm`` export as one ``aten.rms_norm.default`` node, not as
the decomposed ``pow -> mean -> rsqrt`` chain the fusion patterns look for. The family that
owns the Circle op also owns the mapping (``FusionFamily.composites``; for RMSNorm see
``circle_fx/fusions/rms_norm.py``); this pass only applies the mappings. A mapping that
produces the family's op is a fusion like any other, so it is recorded in the program's
fusion log (with the composite's source line) and counted in the summary.

Rewrites that belong to no fusion family (multi-tensor indexing -> one flat GATHER, see
``flat_index.py``; per-row dispatch through a mask -> a select, ``masked_rows.py``; a gather
from a constant of one value -> that value, ``uniform_gather.py``) are applied by the same walk,
from :data:`REWRITES`.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..fusion_log import FusionRecord
from ..fusions import composite_rules
from ..op_traits import APPROXIMATED
from ..source import source_line
from .base import Pass
from .flat_index import flat_index
from .masked_rows import masked_rows
from .uniform_gather import uniform_gather

#: aten op -> rewrite (``None`` leaves the node alone), owned by no fusion family
REWRITES = {torch.ops.aten.index.Tensor: flat_index, torch.ops.aten.index_put.default: masked_rows,
            torch.ops.aten.gather.default: uniform_gather}


class DecomposeComposites(Pass):
    """Replace composite ops (``aten.rms_norm``) by Circle ops or primitive aten ops, then
    decompose every op that has no lowering into ops that do (when possible).

    ``defer``: ops left alone here (by default the approximate decompositions,
    ``op_traits.APPROXIMATED``, so fusions see the exact op first);
    ``finalize_pipeline`` passes none, so they are decomposed before emission."""

    name = "decompose"

    def __init__(self, defer=None) -> None:
        super().__init__()
        self.defer = APPROXIMATED if defer is None else frozenset(defer)

    def run(self, program) -> bool:
        g = program.gm.graph
        rules = composite_rules()
        changed = False
        for n in list(g.nodes):
            owner = rules.get(n.target) if n.op == "call_function" else None
            if owner is None and n.op == "call_function" and n.target in REWRITES:
                owner = (None, REWRITES[n.target])
            if owner is None:
                continue
            family, rule = owner
            with g.inserting_before(n):
                new = rule(n, g)
            if new is not None:
                if family is not None and family.op is not None and isinstance(new, fx.Node) and new.target is family.op:
                    program.fusion_log.applied[new.name] = FusionRecord(
                        family.name, new.name, [_op_name(n.target)], source_line(n), 1)
                n.replace_all_uses_with(new)
                g.erase_node(n)
                changed = True
        # the general fallback: ops without a lowering -> ops with one (see decompose_unlowered)
        from .complex_to_real import complex_to_real
        from .decompose_unlowered import decompose_unlowered

        changed |= complex_to_real(program)
        return decompose_unlowered(program, defer=self.defer) or changed


def _op_name(target) -> str:
    """``aten.rms_norm`` for the record's rule list (what the user's code called)."""
    return str(target).rsplit(".", 1)[0] if str(target).endswith(".default") else str(target)
