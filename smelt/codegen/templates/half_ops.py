"""float16 ReduceMax / ReduceMin (float16 attention as ONNX's function expansions write it).

``f16_reduce_max``: per output element a std::max (std::min) fold from the first element over
the reduced offsets, comparing the exact float widening of each float16 (``kernels/half``) and
keeping the winner's bits (a NaN first element stays, later NaNs are skipped: the rule of the
float ``reduce`` template), with the kept and reduced offsets precomputed as two tables.

float16 Softmax is deliberately not here: computed in float and rounded once it is within one
ulp of onnxruntime's, yet the ONNX test data of the float16 attention expansions is the
reference's float16 arithmetic, and that one ulp took test_attention_4d_causal_fp16_expanded
past its tolerance, where onnxruntime itself is one ulp inside it.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels import half
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS
from smelt.codegen.kernels.loops import copy_step, dtype_name, emit_kernel, work_range
from smelt.codegen.registry import register
from smelt.frontend.onnx_import import op_version
from smelt.ir.graph import Graph, Node


def _shape(g: Graph, name: str) -> list[int]:
    return [int(d) for d in g.values[name].shape]


def _prod(dims: list[int]) -> int:
    return int(np.prod(dims, dtype=np.int64))


# -- ReduceMax / ReduceMin -------------------------------------------------------------------------

def _reduce_axes(node: Node, g: Graph) -> list[int] | str:
    rank = len(_shape(g, node.inputs[0]))
    if op_version(g, node) >= 18:
        if len(node.inputs) > 1 and node.inputs[1]:
            c = g.const(node.inputs[1])
            if c is None:
                return "axes known only at run time"
            axes = [int(a) for a in np.asarray(c).reshape(-1)]
        else:
            axes = []
    else:
        axes = [int(a) for a in (node.attr("axes") or [])]
    if not axes:
        return [] if node.attr("noop_with_empty_axes", 0) else list(range(rank))
    if any(not -rank <= a < rank for a in axes) or len({a % rank for a in axes}) != len(axes):
        return "axes out of range or repeated"
    return sorted(a % rank for a in axes)


def _check_reduce(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    if dtype_name(g, x) != "float16" or dtype_name(g, y) != "float16":
        return f"f16_reduce takes float16 only ({dtype_name(g, x)})"
    if not g.values[x].size or not g.values[y].size:
        return "empty tensor"
    axes = _reduce_axes(node, g)
    return axes if isinstance(axes, str) else None


@register(("ReduceMax", "ReduceMin"), versions=(1, 11, 12, 13, 18, 20), check=_check_reduce, name="f16_reduce_max")
def emit_f16_reduce(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    shape = _shape(g, x)
    axes = _reduce_axes(node, g)
    assert not isinstance(axes, str)
    if not axes:  # noop_with_empty_axes: the input unchanged
        em.step(copy_step(em, em.ptr(x), em.ptr(y), g.values[y].nbytes))
        return
    strides = [_prod(shape[d + 1:]) for d in range(len(shape))]
    kept = [d for d in range(len(shape)) if d not in axes]

    def offsets(dims: list[int]) -> np.ndarray:
        if not dims:
            return np.zeros(1, np.int64)
        idx = np.indices([shape[d] for d in dims], dtype=np.int64).reshape(len(dims), -1)
        return (np.asarray([strides[d] for d in dims], np.int64)[:, None] * idx).sum(axis=0)

    ko, ro = offsets(kept), offsets(axes)
    cmp = "<" if node.op == "ReduceMax" else ">"  # std::max(a, v) = a < v ? v : a
    half.half_helpers(em)
    body = "\n".join([
        f"const uint16_t *restrict X = {em.ptr(x)};", f"uint16_t *restrict Y = (void *){em.ptr(y)};",
        f"const int64_t *restrict KO = {em.weight(ko)}; const int64_t *restrict RO = {em.weight(ro)};",
        work_range(ko.size, g.values[x].size >= PARALLEL_MIN_ELEMS),
        "for (long o = wb; o < we; ++o) {",
        "    const uint16_t *xo = X + KO[o]; uint16_t best = xo[RO[0]]; float a = smelt_h2f(best);",
        f"    for (long r = 1; r < {ro.size}L; ++r) {{ float v = smelt_h2f(xo[RO[r]]); "
        f"if (a {cmp} v) {{ a = v; best = xo[RO[r]]; }} }}",
        "    Y[o] = best;",
        "}"])
    emit_kernel(em, f"f16_{node.op.lower()}", body, f"{node.op} float16 of {shape} over axes {axes}")
