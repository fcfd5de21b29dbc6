"""IR verifier: structural invariants every pass must keep.

Runs on every compile on the imported graph, after the pass pipeline and after layout planning
(linear in the graph: ~3 ms on ResNet-50, ~20 ms on a 2,000-node chain); under SMELT_DEBUG=1
after every pass too. A ``VerifyError`` is a smelt bug: invalid *models* are refused earlier,
with an ``InvalidModelError`` (frontend/validate.py).
"""

from __future__ import annotations

from smelt.errors import VerifyError
from smelt.ir.epilogue import EpilogueActivation, EpilogueBinary
from smelt.ir.graph import Graph


def verify(g: Graph, after: str = "") -> None:
    where = f" after pass {after}" if after else ""
    defined = set(g.inputs) | {k for k, v in g.values.items() if v.const is not None}
    for name in g.inputs:
        if name not in g.values:
            raise VerifyError(f"graph input {name!r} has no value{where}")
    seen_outputs: set[str] = set()
    for node in g.nodes:
        for i in node.all_inputs():
            if i not in g.values:
                raise VerifyError(f"node {node.name!r} reads unknown value {i!r}{where}")
            if i not in defined:
                raise VerifyError(f"node {node.name!r} reads {i!r} before it is produced{where}")
        for o in node.outputs:
            if not o:
                continue
            if o in seen_outputs or o in g.inputs:
                raise VerifyError(f"value {o!r} is produced twice{where}")
            if o not in g.values:
                raise VerifyError(f"node {node.name!r} writes unknown value {o!r}{where}")
            if g.values[o].const is not None:
                raise VerifyError(f"node {node.name!r} writes constant {o!r}{where}")
            seen_outputs.add(o)
            defined.add(o)
        for e in node.epilogue:
            if not isinstance(e, EpilogueBinary | EpilogueActivation):
                raise VerifyError(f"node {node.name!r} has a malformed epilogue {e}{where}")
    for o in g.outputs:
        if o not in defined:
            raise VerifyError(f"graph output {o!r} is never produced{where}")
