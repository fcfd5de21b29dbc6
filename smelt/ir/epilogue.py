"""Typed entries of ``Node.epilogue``: the element-wise ops fused into a host's output
(written by passes/fuse_epilogue.py, read by the templates through codegen/kernels/epilogue.py,
by the fallback expansion in compiler.py and by plan.json's ``epilogue`` list).

Entries are frozen: a pass that renames an operand replaces the entry (``with_input``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import ClassVar

# PRelu(y, slope): y < 0 ? y * slope : y, with slope per channel (face and detection CNNs:
# MTCNN, ArcFace); never swapped (the host's output is always its first input)
BINARY_OPS = ("Add", "Sub", "Mul", "Div", "PRelu")
BROADCASTS = ("full", "channel", "scalar")


@dataclass(frozen=True)
class EpilogueBinary:
    """``y = y <op> input`` (``input <op> y`` when ``swap``). ``broadcast`` says how ``input``
    maps onto the host's output: "full" (same shape, indexed by the flat index), "channel" (one
    value per element of the host's channel axis) or "scalar"."""

    op: str
    input: str
    broadcast: str
    swap: bool = False

    def __post_init__(self) -> None:
        if self.op not in BINARY_OPS or self.broadcast not in BROADCASTS or (self.op == "PRelu" and self.swap):
            raise ValueError(f"bad binary epilogue entry {self!r}")

    def with_input(self, name: str) -> EpilogueBinary:
        return replace(self, input=name)

    def describe(self) -> str:
        return f"{self.op}({self.broadcast})"


@dataclass(frozen=True)
class EpilogueActivation:
    """``y = op(y)`` for an activation of ``smelt.ir.activations.ACTIVATIONS`` (including the
    patterns "SiLU", the fused x * Sigmoid(x), and "Gelu", x * 0.5 * (1 + erf(x / sqrt2))); ``params`` holds every attribute with ONNX's defaults filled in
    (Clip: "min" and "max", always present)."""

    op: str
    params: tuple[tuple[str, float], ...] = ()
    input: ClassVar[None] = None  # reads no tensor

    @staticmethod
    def of(op: str, params: Mapping[str, float] | None = None) -> EpilogueActivation:
        return EpilogueActivation(op, tuple(sorted((k, float(v)) for k, v in (params or {}).items())))

    def param(self, name: str) -> float:
        return dict(self.params)[name]

    def param_dict(self) -> dict[str, float]:
        return dict(self.params)

    def describe(self) -> str:
        return self.op


EpilogueStep = EpilogueBinary | EpilogueActivation
