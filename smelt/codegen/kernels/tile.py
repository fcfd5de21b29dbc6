"""The register tile: J vectors x R broadcast rows of accumulators and the FMA step that updates
them, rendered for any vector ISA description (kernels/isa.py). The GEMM micro-kernels (and its
column kernel), the NCHWc direct conv tiles and the Winograd transform-domain GEMM all run this
one loop body: per step J vector loads, then for each of the R rows one broadcast and J FMAs
into that row's accumulators. What surrounds it (loop nests, zero or load, the epilogue and the
masked store) stays with the kernel; this module names the accumulators they share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from smelt.codegen.kernels.isa import VectorIsa


@dataclass(frozen=True)
class RegisterTile:
    """``J`` x ``R`` vector accumulators named ``acc_fmt.format(j=, r=)``.

    ``vec``: the name prefix of the J vectors loaded per step (``vec0`` ...), ``bcast``: the name
    of the broadcast scalar of a row; ``bcast_first``: FMA operand order ``bcast * vec`` (else
    ``vec * bcast``; the same product, the order the kernel had)."""

    v: VectorIsa
    J: int
    R: int
    acc_fmt: str = "a{j}_{r}"
    vec: str = "w"
    bcast: str = "b"
    bcast_first: bool = True

    def acc(self, j: int, r: int) -> str:
        return self.acc_fmt.format(j=j, r=r)

    def registers(self) -> int:
        """Vector registers the step holds live: accumulators, the J loads and one broadcast."""
        return self.J * self.R + self.J + 1

    def declare(self, init: str | Callable[[int, int], str] | None = "zero", by_row: bool = False) -> list[str]:
        """Declarations, one line per vector (``by_row``: per row): zeroed (``"zero"``), set by
        ``init(j, r)`` (a C expression), or uninitialized (None)."""
        def one(j: int, r: int) -> str:
            if init is None:
                return self.acc(j, r)
            value = self.v.zero() if init == "zero" else init(j, r)  # type: ignore[operator]
            return f"{self.acc(j, r)} = {value}"

        if by_row:
            return [" ".join(f"{self.v.t} {one(j, r)};" for j in range(self.J)) for r in range(self.R)]
        return [f"{self.v.t} " + ", ".join(one(j, r) for r in range(self.R)) + ";" for j in range(self.J)]

    def fma_step(self, load: Callable[[int], str], broadcast: Callable[[int], str],
                 rows: Sequence[int] | None = None, indent: str = "", between: Sequence[str] = ()) -> list[str]:
        """One K step: ``const vec{j} = load(j)`` for each j, the statements ``between`` (a
        prefetch), then for each row r of ``rows`` (default all)
        ``{ const bcast = broadcast(r); acc(j, r) += bcast * vec{j} ... }``."""
        v, t = self.v, self.v.t
        lines = [f"{indent}const {t} {self.vec}{j} = {load(j)};" for j in range(self.J)]
        lines += [indent + x for x in between]
        for r in (range(self.R) if rows is None else rows):
            lines.append(f"{indent}{{ const {t} {self.bcast} = {broadcast(r)};")
            for j in range(self.J):
                a, b = (self.bcast, f"{self.vec}{j}") if self.bcast_first else (f"{self.vec}{j}", self.bcast)
                lines.append(f"{indent}  {self.acc(j, r)} = {v.fmadd(a, b, self.acc(j, r))};")
            lines.append(f"{indent}}}")
        return lines

    def each(self, by_row: bool = False) -> list[tuple[int, int]]:
        """Every (j, r), j-major (``by_row``: r-major): the order kernels store in."""
        if by_row:
            return [(j, r) for r in range(self.R) for j in range(self.J)]
        return [(j, r) for j in range(self.J) for r in range(self.R)]
