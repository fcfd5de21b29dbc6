"""The register tile: J vectors x R broadcast rows of accumulators and the FMA step that updates
them, rendered for any vector description (a ``VectorIsa`` from kernels/isa.py, or a
``MacroVector`` such as the RNN template's 16-lane logical vector ``VX_v``). The GEMM
micro-kernels (and its column kernel), the NCHWc direct conv tiles, the Winograd
transform-domain GEMM and the RNN recurrence all run this one loop body: per step J vector loads
and R broadcasts, and J x R FMAs. What surrounds it (loop nests, zero or load, the epilogue and
the masked store) stays with the kernel; this module names the accumulators they share.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


class TileVector(Protocol):
    """What a register tile needs of a vector description (``VectorIsa`` has it all)."""

    @property
    def t(self) -> str: ...  # the C vector type

    def zero(self) -> str: ...

    def fmadd(self, a: str, b: str, c: str) -> str: ...  # a * b + c

    def op(self, name: str, a: str, b: str) -> str: ...  # add, sub, mul, ...


@dataclass(frozen=True)
class MacroVector:
    """A vector type whose operations are C functions or macros named ``{prefix}_{operation}``:
    the RNN template's logical vector (``MacroVector("VX_v", "VX")``: ``VX_fma``, ``VX_load``,
    ``VX_set1``, ``VX_zero``), whose prefix the RNN renderer replaces per chunk and whose
    definition per ISA is a C header (kernels/rnn_vec.py), so a tile over it renders the same C
    on every ISA."""

    vtype: str
    prefix: str

    @property
    def t(self) -> str:
        return self.vtype

    def zero(self) -> str:
        return f"{self.prefix}_zero()"

    def set1(self, x: str) -> str:
        return f"{self.prefix}_set1({x})"

    def load(self, ptr: str) -> str:
        return f"{self.prefix}_load({ptr})"

    def store(self, ptr: str, v: str) -> str:
        return f"{self.prefix}_store({ptr}, {v});"

    def fmadd(self, a: str, b: str, c: str) -> str:
        return f"{self.prefix}_fma({a}, {b}, {c})"

    def op(self, name: str, a: str, b: str) -> str:
        return f"{self.prefix}_{name}({a}, {b})"


@dataclass(frozen=True)
class RegisterTile:
    """``J`` x ``R`` vector accumulators named ``acc_fmt.format(j=, r=)`` (+ ``suffix``).

    ``vec``: the name prefix of the J vectors loaded per step (``vec0`` ...; ``vec{labels[j]}``
    when ``labels`` names the J vectors, e.g. the RNN's (hidden block, gate) pairs ``"0_2"``, which
    then also stand for j in ``acc_fmt``); ``bcast``: the name of the broadcast of a row (``{r}``
    in it: one name per row); ``bcast_first``: FMA operand order ``bcast * vec`` (else
    ``vec * bcast``; the same product, the order the kernel had). ``suffix`` is appended to every
    name: ``second()`` is a second accumulator set for the same tile.

    ``hoist_broadcasts``: the step's order. False: the J loads, then per row one broadcast and
    its J FMAs (J + 1 inputs live: GEMM, conv, Winograd, where J is small and R large). True: the
    R broadcasts, then per vector one load and its R FMAs (R + 1 inputs live: the RNN, up to 8
    (hidden block, gate) vectors over a few batch rows)."""

    v: TileVector
    J: int
    R: int
    acc_fmt: str = "a{j}_{r}"
    vec: str = "w"
    bcast: str = "b"
    bcast_first: bool = True
    labels: tuple[str, ...] = ()
    suffix: str = ""
    hoist_broadcasts: bool = False

    def __post_init__(self) -> None:
        if self.labels and len(self.labels) != self.J:
            raise ValueError(f"RegisterTile: {len(self.labels)} labels for J={self.J} vectors")

    def _label(self, j: int) -> str | int:
        return self.labels[j] if self.labels else j

    def acc(self, j: int, r: int) -> str:
        return self.acc_fmt.format(j=self._label(j), r=r) + self.suffix

    def vec_name(self, j: int) -> str:
        """The name of the j-th vector loaded in a step."""
        return f"{self.vec}{self._label(j)}{self.suffix}"

    def bcast_name(self, r: int) -> str:
        """The name of row r's broadcast in a step."""
        return self.bcast.format(r=r) + self.suffix

    def second(self, suffix: str = "b") -> RegisterTile:
        """The same tile with every name suffixed: a second accumulator set, e.g. over odd k so a
        latency-bound tile (few accumulators, each one FMA chain over K) runs two chains."""
        return dataclasses.replace(self, suffix=self.suffix + suffix)

    def registers(self) -> int:
        """Vector registers the step holds live: accumulators, the loads and broadcasts."""
        inputs = self.R + 1 if self.hoist_broadcasts else self.J + 1
        return self.J * self.R + inputs

    def declare(self, init: str | Callable[[int, int], str] | None = "zero", by_row: bool = False,
                one_per_line: bool = False) -> list[str]:
        """Declarations, one line per vector (``by_row``: per row; ``one_per_line``: per
        accumulator, in ``each(by_row)`` order): zeroed (``"zero"``), set by ``init(j, r)`` (a C
        expression), or uninitialized (None)."""
        def one(j: int, r: int) -> str:
            if init is None:
                return self.acc(j, r)
            value = self.v.zero() if init == "zero" else init(j, r)  # type: ignore[operator]
            return f"{self.acc(j, r)} = {value}"

        if one_per_line:
            return [f"{self.v.t} {one(j, r)};" for j, r in self.each(by_row)]
        if by_row:
            return [" ".join(f"{self.v.t} {one(j, r)};" for j in range(self.J)) for r in range(self.R)]
        return [f"{self.v.t} " + ", ".join(one(j, r) for r in range(self.R)) + ";" for j in range(self.J)]

    def _fma(self, j: int, r: int) -> str:
        a, b = ((self.bcast_name(r), self.vec_name(j)) if self.bcast_first
                else (self.vec_name(j), self.bcast_name(r)))
        return f"{self.acc(j, r)} = {self.v.fmadd(a, b, self.acc(j, r))};"

    def fma_step(self, load: Callable[[int], str], broadcast: Callable[[int], str],
                 rows: Sequence[int] | None = None, indent: str = "", between: Sequence[str] = (),
                 before_load: Callable[[int], Sequence[str]] | None = None) -> list[str]:
        """One K step over the rows ``rows`` (default all). Without ``hoist_broadcasts``:
        ``const vec{j} = load(j)`` for each j, the statements ``between`` (a prefetch), then for
        each row r ``{ const bcast = broadcast(r); acc(j, r) += bcast * vec{j} ... }``. With it:
        ``const bcast{r} = broadcast(r)`` for each row, ``between``, then for each j the
        statements ``before_load(j)``, ``const vec{j} = load(j)`` and ``acc(j, r) += ...`` for
        each row."""
        t = self.v.t
        rs = range(self.R) if rows is None else rows
        pre = before_load or (lambda j: ())
        lines: list[str] = []
        if self.hoist_broadcasts:
            lines += [f"{indent}const {t} {self.bcast_name(r)} = {broadcast(r)};" for r in rs]
            lines += [indent + x for x in between]
            for j in range(self.J):
                lines += [indent + x for x in pre(j)]
                lines.append(f"{indent}const {t} {self.vec_name(j)} = {load(j)};")
                lines += [f"{indent}{self._fma(j, r)}" for r in rs]
            return lines
        for j in range(self.J):
            lines += [indent + x for x in pre(j)]
            lines.append(f"{indent}const {t} {self.vec_name(j)} = {load(j)};")
        lines += [indent + x for x in between]
        for r in rs:
            lines.append(f"{indent}{{ const {t} {self.bcast_name(r)} = {broadcast(r)};")
            lines += [f"{indent}  {self._fma(j, r)}" for j in range(self.J)]
            lines.append(f"{indent}}}")
        return lines

    def add(self, other: RegisterTile, by_row: bool = False) -> list[str]:
        """Statements ``acc(j, r) += other.acc(j, r)`` (a second set folded in), ``each`` order."""
        return [f"{self.acc(j, r)} = {self.v.op('add', self.acc(j, r), other.acc(j, r))};"
                for j, r in self.each(by_row)]

    def each(self, by_row: bool = False) -> list[tuple[int, int]]:
        """Every (j, r), j-major (``by_row``: r-major): the order kernels store in."""
        if by_row:
            return [(j, r) for r in range(self.R) for j in range(self.J)]
        return [(j, r) for j in range(self.J) for r in range(self.R)]
