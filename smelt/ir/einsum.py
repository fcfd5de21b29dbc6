"""Einsum equations resolved against operand shapes, and their batched-MatMul form.

Read by the Einsum template (``codegen/templates/einsum.py``: the general loop nest) and by the
decomposition that runs a contraction as one batched MatMul (``passes/einsum_matmul.py``), so
both agree on what an equation means. Labels are letters; the dims an operand's ``...`` stands
for are labelled ``.<k>`` (k counted from the right, so they align across operands as
broadcasting does). Implicit mode (no ``->``): the ``...`` dims, then the letters seen once, in
alphabetical order (numpy's and onnxruntime's rule). Spaces are ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ELLIPSIS = "."


@dataclass(frozen=True)
class EinsumSpec:
    out: tuple[str, ...]                 # output labels, in output order
    contracted: tuple[str, ...]          # labels summed over (not in the output)
    sizes: dict[str, int]                # each label's extent
    operands: tuple[tuple[str, ...], ...]  # each operand's labels, dim by dim


def _labels(term: str, rank: int) -> list[str] | None:
    if term.count("...") > 1:
        return None
    if "..." in term:
        head, tail = term.split("...")
        n = rank - len(head) - len(tail)
        if n < 0 or not (head + tail).isalpha() and (head + tail):
            return None
        return list(head) + [f"{ELLIPSIS}{n - 1 - i}" for i in range(n)] + list(tail)
    if len(term) != rank or (term and not term.isalpha()):
        return None
    return list(term)


def parse(equation: str | bytes, shapes: Sequence[Sequence[int]]) -> EinsumSpec | str:
    """The equation resolved against the operands' shapes, or why it does not fit them."""
    eq = (equation.decode() if isinstance(equation, bytes) else str(equation)).replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        return f"equation {eq!r} names {len(terms)} operands, the node has {len(shapes)}"
    operands: list[tuple[str, ...]] = []
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes, strict=True):
        labels = _labels(term, len(shape))
        if labels is None:
            return f"operand term {term!r} does not fit shape {list(shape)}"
        for lab, d in zip(labels, shape, strict=True):
            d = int(d)
            prev = sizes.get(lab)
            if prev is None or prev == 1:
                sizes[lab] = d
            elif d not in (prev, 1) or (d == 1 and not lab.startswith(ELLIPSIS)):
                return f"label {lab!r} has extents {prev} and {d}"
        operands.append(tuple(labels))
    ell = sorted((lab for lab in sizes if lab.startswith(ELLIPSIS)), key=lambda s: -int(s[1:]))
    if arrow:
        out = _labels(rhs, len(rhs.replace("...", "")) + (len(ell) if "..." in rhs else 0))
        if out is None or len(set(out)) != len(out) or any(lab not in sizes for lab in out):
            return f"output term {rhs!r} is not valid for {eq!r}"
    else:
        counts: dict[str, int] = {}
        for labels in operands:
            for lab in labels:
                counts[lab] = counts.get(lab, 0) + 1
        out = ell + sorted(lab for lab, c in counts.items() if c == 1 and not lab.startswith(ELLIPSIS))
    contracted = tuple(lab for lab in sizes if lab not in out)
    return EinsumSpec(tuple(out), contracted, sizes, tuple(operands))


@dataclass(frozen=True)
class MatmulForm:
    """C[batch, m, n] = sum_k A[batch, m, k] B[batch, k, n] with each group a run of labels."""
    batch: tuple[str, ...]
    m: tuple[str, ...]
    n: tuple[str, ...]
    k: tuple[str, ...]


# below this many multiply-adds the loop nest is as fast as transposes + a GEMM call
MATMUL_MIN_MACS = 1 << 14


def matmul_form(spec: EinsumSpec, shapes: Sequence[Sequence[int]]) -> MatmulForm | None:
    """The batched-MatMul form of a two-operand contraction, or None: every label once per
    operand, no broadcast dim (an extent-1 dim under a larger label), every label of an operand
    either in the other operand or in the output (no label summed inside one operand), at least
    one contracted label, and enough work for a GEMM."""
    if len(spec.operands) != 2 or not spec.contracted:
        return None
    a, b = spec.operands
    for labels, shape in zip(spec.operands, shapes, strict=True):
        if len(set(labels)) != len(labels):
            return None
        if any(int(d) != spec.sizes[lab] for lab, d in zip(labels, shape, strict=True)):
            return None
    out = set(spec.out)
    if any(lab not in b and lab not in out for lab in a) or any(lab not in a and lab not in out for lab in b):
        return None
    batch = tuple(lab for lab in spec.out if lab in a and lab in b)
    m = tuple(lab for lab in spec.out if lab in a and lab not in b)
    n = tuple(lab for lab in spec.out if lab in b and lab not in a)
    k = tuple(lab for lab in a if lab in b and lab not in out)
    macs = 1
    for lab in spec.sizes:
        macs *= spec.sizes[lab]
    if macs < MATMUL_MIN_MACS:
        return None
    return MatmulForm(batch, m, n, k)
