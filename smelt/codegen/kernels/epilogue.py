"""Activations, in scalar and vector C, and a node's fused epilogue (see passes/fuse_epilogue.py).

Every template that applies an activation renders it here: the element-wise template, the
GEMM/conv epilogues (gemm.py and the templates that share its tile epilogue: conv.py,
conv_nchwc.py, winograd.py, blocked.py, norm.py) and the RNN template (relu, clip, leaky relu,
hard sigmoid). So NaN and Inf behave the same in a standalone op and in a fused one. (The RNN
template asks for onnxruntime's RNN activation semantics, where Relu and HardSigmoid map NaN to
0: ``nan_to_zero``.)

NaN and Inf follow onnxruntime (the oracle):
- max(a, b) and min(a, b) are always spelled so that a NaN *value* survives: ``SMELT_MAX(a, b)``
  is ``a > b ? a : b`` and x86 ``max_ps(a, b)`` returns ``b`` when either is NaN, so the value
  goes second and the constant first (``max_ps(zero, x)``): one instruction, NaN kept.
  Relu(NaN) = NaN, Clip(NaN) = NaN, HardSigmoid(NaN) = NaN, HardSwish(NaN) = NaN.
- Clip's absent bounds are the float range (ONNX's defaults, what onnxruntime uses), so
  Clip() maps +-Inf to +-FLT_MAX; the fuse pass stores them in the step's params (``min``/``max``).
- Sigmoid(+-Inf) = 1 / 0 exactly and SiLU(-Inf) = -Inf / Inf = NaN (the vector exp is exact at
  +-Inf); Tanh(+-Inf) = +-1; HardSwish(-Inf) = -Inf * 0 = NaN; LeakyRelu(-Inf) = -Inf. The vector
  exp, sigmoid and tanh are csrc/smelt_vec.h's (one implementation per vector width, shared with
  the RNN headers); the scalar forms call libm.

Templates of epilogue hosts (Conv, Gemm, MatMul, BatchNormalization) call
``epilogue_expr(em, node, acc, flat_index, channel)`` on each output element before storing it.
``flat_index`` is the element's row-major index in the output, ``channel`` its index along the
host's channel axis (output channel for Conv/BN, column for Gemm/MatMul).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from smelt.ir.activations import ACTIVATIONS as _TABLE
from smelt.ir.epilogue import EpilogueActivation, EpilogueBinary
from smelt.ir.graph import Node

if TYPE_CHECKING:
    from smelt.codegen.emitter import BlockEmitter


_BINARY_C = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/"}
# every binary epilogue op (ir/epilogue.py's BINARY_OPS) with a rendering here
BINARY_EPILOGUE_OPS = (*_BINARY_C, "PRelu")

# activations with a rendering here: the entries of smelt.ir.activations.ACTIVATIONS
ACTIVATIONS = tuple(_TABLE)
# ... whose vector form calls the vector math of csrc/smelt_vec.h (so needs FMA)
FMA_ACTIVATIONS = frozenset(a.name for a in _TABLE.values() if a.needs_fma)


@dataclass(frozen=True)
class TileOperand:
    """A binary epilogue op with its operand resolved to a C pointer: a GEMM-level operand (bias,
    Gemm's C) or a node.epilogue ``EpilogueBinary``. ``kind``: "full" (indexed by the flat
    index), "row" (GEMM row + row offset), "col" (column) or "scalar"; ``scale`` multiplies the
    operand first (Gemm's beta)."""

    op: str
    ptr: str
    kind: str
    swap: bool = False
    scale: float | None = None


@dataclass(frozen=True)
class TileScale:
    """Multiply by a constant (Gemm's alpha)."""

    value: float
    op: ClassVar[str] = "Scale"


def _lit(x: float, dtype: str = "float32") -> str:
    from smelt.codegen.emitter import c_literal

    return c_literal(x, dtype)


def _fn(name: str, dtype: str) -> str:
    """libm function for the element type: expf for float32, exp for float64."""
    return f"{name}f" if dtype == "float32" else name


# ------------------------------------------------------------------------------------------
# scalar C (``SMELT_MAX(a, b)`` is ``a > b ? a : b``, ``SMELT_MIN(a, b)`` is ``a < b ? a : b``)
# ------------------------------------------------------------------------------------------
def scalar_relu(v: str, dtype: str = "float32") -> str:
    """max(0, v) keeping NaN (``0 > NaN`` is false, so the value is taken)."""
    return f"SMELT_MAX({_lit(0, dtype)}, {v})"


def scalar_clamp(v: str, lo: str | None, hi: str | None) -> str:
    """min(hi, max(lo, v)) with C expressions for the bounds (None: that side unbounded); NaN kept."""
    if lo is not None:
        v = f"SMELT_MAX({lo}, {v})"
    if hi is not None:
        v = f"SMELT_MIN({hi}, {v})"
    return v


def _bound(x: float, dtype: str) -> str | None:
    """A clip bound as a literal, or None when it cannot clip (an infinite bound)."""
    return None if x in (float("inf"), float("-inf")) else _lit(x, dtype)


def unary_float_expr(op: str, v: str, params: Mapping[str, float], dtype: str = "float32") -> str:
    """C expression for the float unary activation ``op`` (an epilogue step: ``params`` holds its
    params, Clip's ``min``/``max`` always present) applied to expression ``v``."""
    one, zero = _lit(1, dtype), _lit(0, dtype)
    if op == "Relu":
        return scalar_relu(v, dtype)
    if op == "Clip":
        return scalar_clamp(v, _bound(params["min"], dtype), _bound(params["max"], dtype))
    if op == "Sigmoid":
        return f"({one} / ({one} + {_fn('exp', dtype)}(-({v}))))"
    if op == "Tanh":
        return f"{_fn('tanh', dtype)}({v})"
    if op == "LeakyRelu":
        return f"(({v}) >= {zero} ? ({v}) : {_lit(params['alpha'], dtype)} * ({v}))"
    if op == "HardSigmoid":
        return scalar_clamp(f"{_lit(params['alpha'], dtype)} * ({v}) + {_lit(params['beta'], dtype)}", zero, one)
    if op == "HardSwish":  # x * HardSigmoid(x) with alpha 1/6, beta 1/2 (its ONNX definition)
        return f"(({v}) * {scalar_clamp(f'({v}) * {_lit(1 / 6, dtype)} + {_lit(0.5, dtype)}', zero, one)})"
    if op == "SiLU":  # x / (1 + e^-x): -Inf / Inf = NaN, as onnxruntime's x * sigmoid(x)
        return f"(({v}) / ({one} + {_fn('exp', dtype)}(-({v}))))"
    if op == "Gelu":  # x/2 (1 + erf(x/sqrt2)): +-Inf -> +Inf / -Inf * 0 = NaN, as onnxruntime's
        return (f"({_lit(0.5, dtype)} * ({v}) * ({one} + {_fn('erf', dtype)}(({v}) * "
                f"{_lit(0.7071067811865476, dtype)})))")
    raise KeyError(op)


def scalar_binary(op: str, a: str, b: str, dtype: str = "float32") -> str:
    """C expression for the binary epilogue op ``op`` on expressions ``a`` (the host's value, or
    the operand when swapped) and ``b``. PRelu calls the prelude's ``smelt_prelu[f]`` (codegen/
    emit.py), whose unconditional product lets gcc vectorize a plain loop of it."""
    if op == "PRelu":
        return f"{_fn('smelt_prelu', dtype)}({a}, {b})"
    return f"({a} {_BINARY_C[op]} {b})"


# ------------------------------------------------------------------------------------------
# vector C
# ------------------------------------------------------------------------------------------
class VectorOps(Protocol):
    """How a template spells vector operations (kernels/isa.py ``VectorIsa``, the RNN's ``VX_`` helpers)."""

    def zero(self) -> str: ...

    def set1(self, x: str) -> str: ...

    def op(self, name: str, a: str, b: str) -> str: ...  # "add", "sub", "mul", "div", "max", "min"

    def ge_zero_select(self, v: str, if_ge: str, if_lt: str) -> str: ...


def vector_relu(v: VectorOps, x: str, nan_to_zero: bool = False) -> str:
    """max(0, x) in one instruction; x second, so NaN survives (``max_ps`` returns its second
    operand when either is NaN). ``nan_to_zero``: x first, NaN gives 0 (onnxruntime's RNN
    activation functors, ``std::max(0.0f, x)``, unlike its Relu op)."""
    return v.op("max", x, v.zero()) if nan_to_zero else v.op("max", v.zero(), x)


def vector_clamp(v: VectorOps, x: str, lo: str | None, hi: str | None) -> str:
    """min(hi, max(lo, x)) with vector expressions for the bounds (None: unbounded); NaN kept."""
    if lo is not None:
        x = v.op("max", lo, x)
    if hi is not None:
        x = v.op("min", hi, x)
    return x


def vector_binary(v: VectorOps, op: str, x: str, operand: str, swap: bool = False) -> str:
    """The binary epilogue op ``op`` on vectors ``x`` (the host's value) and ``operand``."""
    if op == "PRelu":  # x >= 0 ? x : x * slope (an ordered compare: NaN takes NaN * slope = NaN)
        return v.ge_zero_select(x, x, v.op("mul", x, operand))
    fn = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}[op]
    return v.op(fn, operand, x) if swap else v.op(fn, x, operand)


def vector_leaky_relu(v: VectorOps, x: str, alpha: float) -> str:
    """x >= 0 ? x : alpha * x (an ordered compare: NaN takes alpha * NaN = NaN)."""
    return v.ge_zero_select(x, x, v.op("mul", v.set1(_lit(alpha)), x))


def vector_hard_sigmoid(v: VectorOps, x: str, alpha: float, beta: float, nan_to_zero: bool = False) -> str:
    """min(1, max(0, alpha x + beta)); ``nan_to_zero`` as in ``vector_relu``."""
    t = v.op("add", v.op("mul", v.set1(_lit(alpha)), x), v.set1(_lit(beta)))
    return v.op("min", v.set1("1.0f"), vector_relu(v, t, nan_to_zero))


class VectorMath(VectorOps, Protocol):
    """``VectorOps`` plus the names of the vector math functions (kernels/isa.py ``VectorIsa``:
    csrc/smelt_vec.h's ``smelt_vexp*``, ``smelt_vsigmoid*``, ``smelt_vtanh*``, ``smelt_verf*``,
    ``smelt_vgelu*``)."""

    @property
    def exp_fn(self) -> str: ...

    @property
    def sigmoid_fn(self) -> str: ...

    @property
    def tanh_fn(self) -> str: ...

    @property
    def erf_fn(self) -> str: ...

    @property
    def gelu_fn(self) -> str: ...


def vector_unary_expr(v: VectorMath, step: EpilogueActivation, x: str) -> str:
    """Vector expression for activation ``step`` on vector ``x``. Sigmoid, SiLU and Tanh call the
    description's functions of csrc/smelt_vec.h (whose comments give their numerics: exact at
    +-Inf, NaN kept), the one vector math the RNN headers call too."""
    op = step.op
    if op == "Relu":
        return vector_relu(v, x)
    if op == "Clip":
        lo, hi = _bound(step.param("min"), "float32"), _bound(step.param("max"), "float32")
        return vector_clamp(v, x, lo and v.set1(lo), hi and v.set1(hi))
    if op == "LeakyRelu":
        return vector_leaky_relu(v, x, step.param("alpha"))
    if op == "HardSigmoid":
        return vector_hard_sigmoid(v, x, step.param("alpha"), step.param("beta"))
    if op == "HardSwish":
        return v.op("mul", x, vector_hard_sigmoid(v, x, 1 / 6, 0.5))
    if op == "Sigmoid":  # 1 / (1 + e^-x)
        return f"{v.sigmoid_fn}({x})"
    if op == "SiLU":  # x / (1 + e^-x): -Inf / Inf = NaN, as onnxruntime's x * sigmoid(x)
        one = v.set1("1.0f")
        return v.op("div", x, v.op("add", one, f"{v.exp_fn}({v.op('sub', v.zero(), x)})"))
    if op == "Tanh":
        return f"{v.tanh_fn}({x})"
    if op == "Gelu":  # (x/2)(1 + erf(x/sqrt2)), the scalar form's order, with GELU's own erf
        return f"{v.gelu_fn}({x})"
    raise KeyError(op)


# ------------------------------------------------------------------------------------------
# a node's fused epilogue, per element
# ------------------------------------------------------------------------------------------
def epilogue_expr(em: BlockEmitter, node: Node, acc: str, flat_index: str, channel: str) -> str:
    """Apply ``node.epilogue`` to the accumulator expression ``acc``."""
    expr = acc
    for step in node.epilogue:
        if isinstance(step, EpilogueBinary):
            ptr = em.ptr(step.input)
            idx = {"full": flat_index, "channel": channel, "scalar": "0"}[step.broadcast]
            other = f"{ptr}[{idx}]"
            a, b = (other, f"({expr})") if step.swap else (f"({expr})", other)
            expr = scalar_binary(step.op, a, b)
        else:
            expr = unary_float_expr(step.op, expr, step.param_dict())
    return expr


def epilogue_doc(node: Node) -> str:
    if not node.epilogue:
        return "no epilogue"
    return "epilogue: " + " -> ".join(e.describe() for e in node.epilogue)
