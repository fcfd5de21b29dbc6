"""Einsum: any equation (explicit or implicit output, repeated labels = diagonals, ``...``
broadcasting) as one loop nest over the output with the contracted labels summed inside.

float32 contractions with a batched-MatMul form (``ir.einsum.matmul_form``: two operands, each
label once, enough work) are refused here: ``passes/einsum_matmul.py`` runs them as Transpose +
Reshape + MatMul, on the GEMM (30-100x faster than this loop nest on attention-sized ones).

The equation (``ir.einsum.parse``) is resolved at compile time into, per label, its extent and
per input the element stride it advances (a label repeated within one input adds its dims'
strides: the diagonal; a broadcast ``...`` dim of extent 1 advances 0). Each output element is then
``sum over the contracted labels of prod_k X_k[offset_k]``, the contracted labels as nested
loops with constant strides (innermost the last label, which the compiler can vectorize when
its strides are 1), accumulated in the input type (float32, float64; int32/int64 in unsigned
arithmetic, wrapping as onnxruntime's integer Einsum does). Output elements are split over the
threads.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS
from smelt.codegen.registry import register
from smelt.ir.einsum import matmul_form, parse
from smelt.ir.graph import PLAIN, Graph, Node
from smelt.ir.types import c_type

TYPES = ("float32", "float64", "int32", "int64")


def _dtype(g: Graph, name: str) -> str:
    return np.dtype(g.values[name].dtype).name


def _shapes(node: Node, g: Graph) -> list[list[int]]:
    return [[int(d) for d in g.values[x].shape] for x in node.inputs]


def _strides(labels: list[str], shape: list[int], sizes: dict[str, int]) -> dict[str, int]:
    """Per label, the element stride one step of it advances in this operand."""
    st: dict[str, int] = {}
    acc = 1
    for lab, d in zip(reversed(labels), reversed(shape), strict=True):
        if not (d == 1 and sizes[lab] != 1):  # a broadcast dim stays put
            st[lab] = st.get(lab, 0) + acc
        acc *= d
    return st


def _check(node: Node, g: Graph) -> str | None:
    if not node.inputs or not all(node.inputs):
        return "Einsum needs its inputs"
    dt = _dtype(g, node.inputs[0])
    names = list(node.inputs) + [node.outputs[0]]
    if dt not in TYPES or any(_dtype(g, n) != dt for n in names):
        return f"native Einsum takes one of {TYPES} for every operand"
    if any(g.values[n].layout != PLAIN for n in names):
        return "Einsum reads plain layouts only"
    spec = parse(node.attr("equation", ""), _shapes(node, g))
    if isinstance(spec, str):
        return spec
    if [spec.sizes[lab] for lab in spec.out] != [int(d) for d in g.values[node.outputs[0]].shape]:
        return "output shape does not match the equation"
    if dt == "float32" and matmul_form(spec, _shapes(node, g)) is not None:
        return "a contraction that runs as one batched MatMul (passes/einsum_matmul.py)"
    return None


@register("Einsum", check=_check, name="einsum")
def emit_einsum(node: Node, g: Graph, em: BlockEmitter) -> None:
    spec = parse(node.attr("equation", ""), _shapes(node, g))
    assert not isinstance(spec, str)
    out, contracted, sizes, ins = spec.out, spec.contracted, spec.sizes, spec.operands
    y = node.outputs[0]
    dt = _dtype(g, y)
    t = c_type(dt)
    integer = dt.startswith("int")
    u = "uint64_t" if dt == "int64" else "uint32_t"
    strides = [_strides(list(labels), [int(d) for d in g.values[x].shape], sizes)
               for labels, x in zip(ins, node.inputs, strict=True)]
    total = int(np.prod([sizes[lab] for lab in out], dtype=np.int64))
    inner = int(np.prod([sizes[lab] for lab in contracted], dtype=np.int64))
    split = (f"smelt_range({total}, tid, nt, &ob, &oe);" if total * max(inner, 1) >= PARALLEL_MIN_ELEMS
             and total > 1 else f"ob = 0; oe = tid == 0 ? {total} : 0;")
    lines = [f"const {t} *restrict X{k} = {em.ptr(x)};" for k, x in enumerate(node.inputs)]
    lines += [f"{t} *restrict Y = {em.ptr(y)};", f"long ob, oe; {split}", "for (long o = ob; o < oe; ++o) {",
              "    long rem = o; " + " ".join(f"long b{k} = 0;" for k in range(len(ins)))]
    for lab in reversed(out):  # the output is row-major over its labels
        adds = " ".join(f"b{k} += ix * {st[lab]};" for k, st in enumerate(strides) if st.get(lab))
        lines.append(f"    {{ long ix = rem % {sizes[lab]}; rem /= {sizes[lab]}; {adds} }}")
    prod = " * ".join(f"({u})X{k}[i{k}]" if integer else f"X{k}[i{k}]" for k in range(len(ins)))
    lines.append(f"    {u if integer else t} acc = 0;")
    depth = "    "
    offs = {k: f"b{k}" for k in range(len(ins))}
    for j, lab in enumerate(contracted):
        lines.append(f"{depth}for (long c{j} = 0; c{j} < {sizes[lab]}; ++c{j}) {{")
        depth += "    "
        for k, st in enumerate(strides):
            if st.get(lab):
                offs[k] = f"{offs[k]} + c{j} * {st[lab]}"
    idx = " ".join(f"const long i{k} = {offs[k]};" for k in range(len(ins)))
    lines.append(f"{depth}{{ {idx} acc += {prod}; }}")
    for _ in contracted:
        depth = depth[:-4]
        lines.append(f"{depth}}}")
    lines.append(f"    Y[o] = ({t})acc;")
    lines.append("}")
    eq = str(node.attr("equation", "")).replace(" ", "")
    em.step("\n".join(lines), name=f"einsum_{dt}", doc=f"Einsum {eq}")
    em.schedule(algorithm=f"loop nest over {len(out)} output and {len(contracted)} contracted labels",
                threads="output elements")
