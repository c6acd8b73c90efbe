"""Dead code elimination, plus dropping constants no node refers to any more.

The second half matters for memory: after folding and fusion, the attributes of erased
``get_attr`` nodes would otherwise keep their tensors alive until export ends.

One reverse sweep (a node's inputs come after it, so chains die in the same sweep) plus
one pass over the attributes: O(nodes + constants).
"""
from __future__ import annotations

from ..op_traits import SIDE_EFFECT_ONLY
from ..pass_protocol import Pass


class DeadCodeElimination(Pass):
    name = "dce"

    def run(self, program) -> bool:
        gm = program.gm
        g = gm.graph
        changed = False
        for n in reversed(list(g.nodes)):
            if n.op in ("placeholder", "output") or n.users:
                continue
            if n.op == "call_function" and n.is_impure() and n.target not in SIDE_EFFECT_ONLY:
                continue
            g.erase_node(n)
            changed = True
        used = {n.target for n in g.nodes if n.op == "get_attr"}
        for name in [k for k in gm._buffers if k not in used]:
            del gm._buffers[name]
        return changed
