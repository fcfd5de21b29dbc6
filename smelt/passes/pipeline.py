"""The pass pipeline, in order.

The IR verifier runs on the imported graph and after the last pass (cheap: linear in the graph);
under SMELT_DEBUG=1 after every pass too. Model validation that needs shapes
(``frontend.validate.check_graph``) runs after each shape inference, before any pass evaluates a
node (constant folding runs onnx.reference, which trusts its attributes).
"""

from __future__ import annotations

from collections.abc import Callable

from smelt import settings
from smelt.frontend.validate import check_graph
from smelt.ir.graph import Graph
from smelt.ir.verify import verify
from smelt.passes.constant_folding import fold_constants
from smelt.passes.dead_nodes import eliminate_dead_nodes
from smelt.passes.eliminate_identity import eliminate_identity
from smelt.passes.fold_batchnorm import fold_batchnorm
from smelt.passes.fuse_epilogue import fuse_epilogues
from smelt.passes.shape_inference import infer_shapes

Pass = Callable[[Graph], Graph]

# (name, pass, enabled at opt_level >= n)
PASSES: list[tuple[str, Pass, int]] = [
    ("infer_shapes", infer_shapes, 0),
    ("validate", check_graph, 0),
    ("eliminate_identity", eliminate_identity, 1),
    ("fold_constants", fold_constants, 1),
    ("infer_shapes_after_folding", infer_shapes, 1),
    ("validate_after_folding", check_graph, 1),
    ("eliminate_dead_nodes", eliminate_dead_nodes, 0),
    ("fold_batchnorm", fold_batchnorm, 1),
    ("fuse_epilogues", fuse_epilogues, 1),
]


def run_passes(g: Graph, opt_level: int = 1) -> Graph:
    check = settings.debug()
    verify(g, "import")
    last = "import"
    for name, fn, level in PASSES:
        if opt_level < level:
            continue
        g = fn(g)
        last = name
        if check:
            verify(g, name)
    if not check:
        verify(g, last)
    return g
