"""The toolchain's flags: regression tests for gcc miscompiles seen on generated code."""

from __future__ import annotations

import ctypes

import numpy as np

from smelt.codegen.toolchain import build_shared_library

# A step function shaped like the element-wise template's output (tid-guarded row range, loop
# storing through a pointer loaded from the context). gcc 12 -O1..-O3 concluded it had no side
# effects and deleted the call from `body`; smelt's flags must keep it.
DELETED_CALL_SOURCE = r'''
#include "smelt_rt.h"
typedef struct { char *arena; const char *W; } ctx_t;
static __attribute__((noinline)) void step(ctx_t *c, int tid, int nt) {
    char *arena = c->arena; const char *W = c->W;
    (void)nt;
    const uint8_t *restrict C = (const uint8_t *)(arena + 64);
    const float *restrict A = (const float *)(W + 128);
    const float *restrict B = (const float *)(W + 64);
    float *restrict Y = (float *)(arena + 128);
    long rb, re; if (tid == 0) { rb = 0; re = 2; } else { rb = re = 0; }
    for (long r = rb; r < re; ++r) {
        long o0 = 0, oo = 0, rem = r;
        { long ix = rem % 2; rem /= 2; o0 += ix * 18; oo += ix * 18; }
        for (long i = 0; i < 18; ++i) Y[oo + i] = C[o0 + i] ? A[0] : B[0];
    }
}
__attribute__((visibility("default"))) void body(char *arena, const char *W, int tid) {
    ctx_t c = {arena, W};
    step(&c, tid, 1);
}
'''


def test_step_call_is_not_deleted():
    lib = ctypes.CDLL(str(build_shared_library(DELETED_CALL_SOURCE, name="deleted_call")))
    arena = np.zeros(512, np.uint8)
    arena[64:100] = np.arange(36) % 3 == 0
    weights = np.zeros(64, np.float32)
    weights[32] = -np.inf  # byte 128
    weights[16] = 5.0  # byte 64
    lib.body(arena.ctypes.data_as(ctypes.c_char_p), weights.ctypes.data_as(ctypes.c_char_p), 0)
    got = arena[128:128 + 36 * 4].view(np.float32)
    want = np.where(np.arange(36) % 3 == 0, -np.inf, 5.0).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_c_literal_beyond_the_float_range_is_infinity():
    """A float32 literal from a value beyond the float range (a float64 folded constant) rounds to
    +-Inf as a cast does; it was rendered as the invalid C token `inff`."""
    from smelt.codegen.emitter import c_literal

    assert c_literal(1e40) == "INFINITY" and c_literal(-1e40) == "(-INFINITY)"
    assert c_literal(1e40, "float64") == "1e+40"
    assert c_literal(3.4028235e38) == "3.4028234663852886e+38f"  # FLT_MAX stays finite
