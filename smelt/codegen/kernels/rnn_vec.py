"""The RNN template's vector math per ISA, as data: which C header implements the 16-lane logical
vector (``VX_v``, the packing unit of hidden blocks) and how many machine registers one logical
vector takes, from which the register-tile budget follows.

The headers live in ``csrc/`` (real C files, read at render time and embedded in the generated
source with their ``VX_`` names prefixed per chunk); ``rnn_vec_common.h`` (exotic activations,
the group barrier) is written over the API every ISA header provides. The native headers' exp,
sigmoid and tanh are ``csrc/smelt_vec.h``'s (one vector-math implementation per width). Which header an ISA uses
is a field of its description (``kernels/isa.py``: ``VectorIsa.rnn_header``); ISAs without a
native one (sse, neon, scalar, AVX2 without FMA) use the portable 16-float struct.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from smelt.codegen.kernels.isa import PORTABLE, VEC_HEADER, vector_isa
from smelt.target import Target

CSRC = Path(__file__).resolve().parent / "csrc"
PORTABLE_HEADER = PORTABLE.rnn_header
LOGICAL_LANES = 16  # floats per logical vector on every ISA


@dataclass(frozen=True)
class RnnVecIsa:
    header: str  # file in csrc/
    registers_per_vector: int  # machine vector registers one 16-lane logical vector occupies
    native: bool  # vector intrinsics (False: the portable struct, libm math)

    def acc_budget(self, target: Target) -> int:
        """Logical-vector accumulators a register tile may keep: 3/4 of the target's vector
        registers (the rest hold the broadcast inputs and the loaded weights), e.g. 24 of 32 zmm
        on AVX-512, 6 pairs of 16 ymm on AVX2."""
        return max(1, vector_isa(target).registers * 3 // 4 // self.registers_per_vector)


def rnn_vec(target: Target) -> RnnVecIsa:
    """The RNN vector math for ``target``: the header its ISA description names
    (``VectorIsa.rnn_header``) and the registers one logical vector takes (16 / lanes)."""
    vx = vector_isa(target)
    native = vx.rnn_header != PORTABLE_HEADER
    per_vector = max(1, LOGICAL_LANES // vx.lanes) if native else 1
    return RnnVecIsa(vx.rnn_header, per_vector, native)


@cache
def _read(name: str) -> str:
    return (CSRC / name).read_text()


def vmath_source(prefix: str, target: Target) -> str:
    """The vector-math helpers for ``target`` (its ISA's header + the common one), names prefixed.
    A native header calls smelt_vec.h's exp/sigmoid/tanh (the one implementation the fused
    epilogues use too): that header comes first, under its include guard, so the chunk compiles
    on its own as well as after the copy every translation unit embeds (toolchain.py)."""
    isa = rnn_vec(target)
    text = _read(isa.header) + _read("rnn_vec_common.h")
    shared = _read(VEC_HEADER.name) if isa.native else ""
    return shared + text.replace("VX_", f"{prefix}_")
