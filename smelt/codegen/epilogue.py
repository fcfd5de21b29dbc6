"""Render a node's fused epilogue (see passes/fuse_epilogue.py) as a C expression.

Templates of epilogue hosts (Conv, Gemm, MatMul, BatchNormalization) call
``epilogue_expr(em, node, acc, flat_index, channel)`` on each output element before storing it.
``flat_index`` is the element's row-major index in the output, ``channel`` its index along the
host's channel axis (output channel for Conv/BN, column for Gemm/MatMul).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from smelt.ir.graph import Node

if TYPE_CHECKING:
    from smelt.codegen.emit import BlockEmitter


_BINARY_C = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/"}


def _f(x: float) -> str:
    from smelt.codegen.emit import c_literal

    return c_literal(x, "float32")


def unary_float_expr(op: str, v: str, params: dict) -> str:
    """C expression for a float32 unary activation applied to expression ``v``."""
    if op == "Relu":
        return f"SMELT_MAX({v}, 0.0f)"
    if op == "Clip":
        lo, hi = params.get("min", float("-inf")), params.get("max", float("inf"))
        expr = v
        if lo != float("-inf"):
            expr = f"SMELT_MAX({expr}, {_f(lo)})"
        if hi != float("inf"):
            expr = f"SMELT_MIN({expr}, {_f(hi)})"
        return expr
    if op == "Sigmoid":
        return f"(1.0f / (1.0f + expf(-({v}))))"
    if op == "Tanh":
        return f"tanhf({v})"
    if op == "LeakyRelu":
        return f"(({v}) >= 0.0f ? ({v}) : {_f(params['alpha'])} * ({v}))"
    if op == "HardSigmoid":
        return f"SMELT_MIN(SMELT_MAX({_f(params['alpha'])} * ({v}) + {_f(params['beta'])}, 0.0f), 1.0f)"
    if op == "HardSwish":
        return f"(({v}) * SMELT_MIN(SMELT_MAX(({v}) * (1.0f / 6.0f) + 0.5f, 0.0f), 1.0f))"
    if op == "SiLU":
        return f"(({v}) / (1.0f + expf(-({v}))))"
    raise KeyError(op)


def epilogue_expr(em: BlockEmitter, node: Node, acc: str, flat_index: str, channel: str) -> str:
    """Apply ``node.epilogue`` to the accumulator expression ``acc``."""
    expr = acc
    for step in node.epilogue:
        op = step["op"]
        if op in ("Add", "Sub", "Mul", "Div"):
            ptr = em.ptr(step["input"])
            idx = {"full": flat_index, "channel": channel, "scalar": "0"}[step["broadcast"]]
            other = f"{ptr}[{idx}]"
            a, b = (other, f"({expr})") if step.get("swap") else (f"({expr})", other)
            expr = f"({a} {_BINARY_C[op]} {b})"
        else:
            expr = unary_float_expr(op, expr, step)
    return expr


def epilogue_doc(node: Node) -> str:
    if not node.epilogue:
        return "no epilogue"
    return "epilogue: " + " -> ".join(
        e["op"] + (f"({e['broadcast']})" if "broadcast" in e else "") for e in node.epilogue
    )
