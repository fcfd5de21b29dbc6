"""Einsum: any equation (explicit or implicit output, repeated labels = diagonals, ``...``
broadcasting) as one loop nest over the output with the contracted labels summed inside.

The equation is resolved at compile time into, per label, its extent and per input the element
stride it advances (a label repeated within one input adds its dims' strides: the diagonal; a
broadcast ``...`` dim of extent 1 advances 0). Each output element is then
``sum over the contracted labels of prod_k X_k[offset_k]``, the contracted labels as nested
loops with constant strides (innermost the last label, which the compiler can vectorize when
its strides are 1), accumulated in the input type (float32, float64; int32/int64 in unsigned
arithmetic, wrapping as onnxruntime's integer Einsum does). Output elements are split over the
threads. Implicit mode (no ``->``) outputs the ``...`` dims, then the labels seen once, in
alphabetical order (numpy's and onnxruntime's rule). Spaces in the equation are ignored.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS
from smelt.codegen.registry import register
from smelt.ir.graph import PLAIN, Graph, Node
from smelt.ir.types import c_type

TYPES = ("float32", "float64", "int32", "int64")
ELLIPSIS = "."  # the label of an ellipsis dim is "." + its position from the right


def _dtype(g: Graph, name: str) -> str:
    return np.dtype(g.values[name].dtype).name


def _equation(node: Node) -> str:
    eq = node.attr("equation", "")
    return (eq.decode() if isinstance(eq, bytes) else str(eq)).replace(" ", "")


def _labels(term: str, rank: int) -> list[str] | None:
    """The labels of one operand's dims, its ``...`` expanded to as many dims as its rank leaves
    (named by position from the right, so they align across operands as broadcasting does)."""
    if term.count("...") > 1:
        return None
    if "..." in term:
        head, tail = term.split("...")
        n = rank - len(head) - len(tail)
        if n < 0 or not (head + tail).isalpha():
            return None
        return list(head) + [f"{ELLIPSIS}{n - 1 - i}" for i in range(n)] + list(tail)
    if len(term) != rank or (term and not term.isalpha()):
        return None
    return list(term)


def resolve(node: Node, g: Graph) -> tuple[list[str], list[str], dict[str, int], list[list[str]]] | str:
    """(output labels, contracted labels, extents, each input's labels), or why not."""
    eq = _equation(node)
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(node.inputs):
        return f"equation {eq!r} names {len(terms)} operands, the node has {len(node.inputs)}"
    ins: list[list[str]] = []
    sizes: dict[str, int] = {}
    for term, name in zip(terms, node.inputs, strict=True):
        shape = [int(d) for d in g.values[name].shape]
        labels = _labels(term, len(shape))
        if labels is None:
            return f"operand term {term!r} does not fit shape {shape}"
        for lab, d in zip(labels, shape, strict=True):
            prev = sizes.get(lab)
            if prev is None or prev == 1:
                sizes[lab] = d
            elif d not in (prev, 1) or (d == 1 and prev != 1 and not lab.startswith(ELLIPSIS)):
                return f"label {lab!r} has extents {prev} and {d}"
        ins.append(labels)
    ell = sorted((lab for lab in sizes if lab.startswith(ELLIPSIS)), key=lambda s: -int(s[1:]))
    if arrow:
        out = _labels(rhs, len(rhs.replace("...", "")) + len(ell)) if "..." in rhs else _labels(rhs, len(rhs))
        if out is None or len(set(out)) != len(out) or any(lab not in sizes for lab in out):
            return f"output term {rhs!r} is not valid for {eq!r}"
    else:
        counts: dict[str, int] = {}
        for labels in ins:
            for lab in labels:
                counts[lab] = counts.get(lab, 0) + 1
        out = ell + sorted(lab for lab, c in counts.items() if c == 1 and not lab.startswith(ELLIPSIS))
    contracted = [lab for lab in sizes if lab not in out]
    return out, contracted, sizes, ins


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
    r = resolve(node, g)
    if isinstance(r, str):
        return r
    out, _, sizes, _ = r
    if [sizes[lab] for lab in out] != [int(d) for d in g.values[node.outputs[0]].shape]:
        return "output shape does not match the equation"
    return None


@register("Einsum", check=_check, name="einsum")
def emit_einsum(node: Node, g: Graph, em: BlockEmitter) -> None:
    out, contracted, sizes, ins = resolve(node, g)  # type: ignore[misc]
    y = node.outputs[0]
    dt = _dtype(g, y)
    t = c_type(dt)
    integer = dt.startswith("int")
    u = "uint64_t" if dt == "int64" else "uint32_t"
    strides = [_strides(labels, [int(d) for d in g.values[x].shape], sizes)
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
    eq = _equation(node)
    em.step("\n".join(lines), name=f"einsum_{dt}", doc=f"Einsum {eq}")
    em.schedule(algorithm=f"loop nest over {len(out)} output and {len(contracted)} contracted labels",
                threads="output elements")
