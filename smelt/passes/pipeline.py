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
from smelt.passes.activation_nodes import collapse_activation_patterns
from smelt.passes.constant_folding import fold_constant_nodes, fold_constants
from smelt.passes.dead_nodes import eliminate_dead_nodes
from smelt.passes.deconv_as_conv import deconv_as_conv
from smelt.passes.denormal_weights import flush_denormal_weights
from smelt.passes.eliminate_identity import eliminate_identity
from smelt.passes.expand_functions import expand_functions
from smelt.passes.fold_batchnorm import fold_batchnorm
from smelt.passes.fuse_attention import fuse_attention
from smelt.passes.fuse_epilogue import fuse_epilogues
from smelt.passes.fuse_layernorm import fuse_layernorm
from smelt.passes.hoist_shared_gemms import hoist_shared_gemms
from smelt.passes.inline_if import inline_constant_ifs
from smelt.passes.lift_1d import lift_1d_convs
from smelt.passes.lift_1d_integer import lift_1d_integer_convs
from smelt.passes.lower_qdq import lower_qdq
from smelt.passes.matmul_integer_to_float import fuse_matmul_integer_to_float
from smelt.passes.runtime_if import convert_runtime_ifs
from smelt.passes.shape_inference import infer_shapes
from smelt.passes.sink_transposes import sink_transposes
from smelt.passes.slice_assign import slice_assign_as_where
from smelt.passes.spatial_mean import spatial_mean_as_global_pool
from smelt.passes.string_labels import index_string_labels
from smelt.passes.unique_lookup import gather_through_unique
from smelt.passes.unroll_loops import unroll_loops

Pass = Callable[[Graph], Graph]

# rounds of fold + shape inference at most: each round resolves one more link of a chain like
# Reshape(x, Concat(Slice(Shape(y)), -1)) -> Shape -> ... (PP-OCRv4's recognizer needs 4)
MAX_FOLD_ROUNDS = 16


def fold_to_fixpoint(g: Graph) -> Graph:
    """Constant folding, If inlining and shape inference in turn until a round changes nothing:
    a Shape can only fold once inference has sized its input, which needed the previous round's
    folds (exported attention blocks compute every Reshape target from Shape ops), and an If's
    condition is often such a Shape test whose taken branch then needs inference in turn.
    Validation follows each inference, before the next fold evaluates a node. A node no template
    runs is then expanded into its schema's function body where that runs natively (its shapes
    are known only now; the body is folded and inferred by the next round); so is a Scan or Loop
    of static length into its body once per iteration (``unroll_loops``), and a slice
    assignment with run-time bounds into a select of static shape (``slice_assign``)."""
    for _ in range(MAX_FOLD_ROUNDS):
        before = _fold_signature(g)
        g = check_graph(infer_shapes(eliminate_identity(inline_constant_ifs(fold_constants(g)))))
        g = slice_assign_as_where(unroll_loops(expand_functions(g)))
        if _fold_signature(g) == before:
            # what folding could not decide is decided at run time: the branches are inlined
            # under a select (runtime_if.py) and folded like the rest by the next rounds
            if not convert_runtime_ifs(g):
                break
    return g


def _fold_signature(g: Graph) -> tuple[int, int, int, int]:
    """What a fold round changes: the node count, the If count (inlining a one-node branch keeps
    the count), and how many values are constant and how many have a static shape (an expanded
    Einsum added six nodes where folding removed six: the round looked idle, and the Shape of the
    Einsum's output, sized only by that round, was never folded: DeepFilterNet3's GRU had no
    input shape)."""
    static = sum(1 for v in g.values.values() if v.shape is not None and all(isinstance(d, int) for d in v.shape))
    return len(g.nodes), sum(n.op == "If" for n in g.nodes), sum(v.is_const for v in g.values.values()), static


# (name, pass, enabled at opt_level >= n)
PASSES: list[tuple[str, Pass, int]] = [
    ("infer_shapes", infer_shapes, 0),
    ("validate", check_graph, 0),
    ("eliminate_identity", eliminate_identity, 1),
    # the Constant nodes' values, for the passes before folding to read like initializers
    ("fold_constant_nodes", fold_constant_nodes, 1),
    # before folding, which would turn the weights' DequantizeLinear into float constants
    ("lower_qdq", lower_qdq, 1),
    # before folding, so what follows an embedding lookup through Unique gets static shapes
    ("gather_through_unique", gather_through_unique, 1),
    ("fold_constants", fold_to_fixpoint, 1),
    # after folding (the weights' scales are constants then): onnxruntime's dynamic quantization
    ("fuse_matmul_integer_to_float", fuse_matmul_integer_to_float, 1),
    ("eliminate_dead_nodes", eliminate_dead_nodes, 0),
    # string-labelled tree classifiers: the ensemble native, the label lookup on the fallback
    ("index_string_labels", index_string_labels, 1),
    # before BatchNorm folding and epilogue fusion, which then take the ops it moves onto the conv
    ("deconv_as_conv", deconv_as_conv, 1),
    # before BatchNorm folding, epilogue fusion and layout planning, which then see 2-D convs
    ("lift_1d_convs", lift_1d_convs, 1),
    ("lift_1d_integer_convs", lift_1d_integer_convs, 1),
    ("fold_batchnorm", fold_batchnorm, 1),
    # after BatchNorm folding (which rewrites a Gemm's weights), before epilogue fusion (which
    # then fuses the recurrent Gemm's Add of its hoisted row)
    ("hoist_shared_gemms", hoist_shared_gemms, 1),
    ("fuse_layernorm", fuse_layernorm, 1),
    ("fuse_attention", fuse_attention, 1),
    # after attention fusion (whose pattern has the head split's Transpose before the scale Mul),
    # before epilogue fusion, which then finds the ops it moved next to a conv
    ("sink_transposes", sink_transposes, 1),
    ("fuse_epilogues", fuse_epilogues, 1),
    # what no Conv/MatMul took as an epilogue: one node, one pass, vector math
    ("collapse_activation_patterns", collapse_activation_patterns, 1),
    # after every pattern that reads a ReduceMean: an image's spatial mean runs on blocked layouts
    ("spatial_mean_as_global_pool", spatial_mean_as_global_pool, 1),
    # last, so the weights BatchNorm folding rescaled are seen too; at every opt level (a
    # numeric behaviour, switched by its option alone)
    ("flush_denormal_weights", flush_denormal_weights, 0),
]


def run_passes(g: Graph, opt_level: int = 1, skip: frozenset[str] = frozenset()) -> Graph:
    """The passes of ``opt_level`` in order, but those named in ``skip`` (the compile options'
    switches: ``CompileOptions.skipped_passes``)."""
    check = settings.debug()
    verify(g, "import")
    last = "import"
    for name, fn, level in PASSES:
        if opt_level < level or name in skip:
            continue
        g = fn(g)
        last = name
        if check:
            verify(g, name)
    if not check:
        verify(g, last)
    return g
