"""Native MatMulInteger and QLinearMatMul against onnxruntime: equal, not close.

Every ISA the host runs, 1 and 2 threads; uint8 and int8 on both sides, zero points absent,
scalar and per column of B (onnxruntime refuses a per-row zero point of A), at the ends of the range; constant and run-time B; shared and
batched B; M = 1 (the column split), ragged K and N; requantization saturating both ways.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import AVX_VNNI, force_isa
from node_cases import Cases, build_model, check, oracle

import smelt

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(20261126)
ISAS = ["native", "avx2", AVX_VNNI, "scalar"]


def _q(dtype, *shape) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, int(info.max) + 1, shape).astype(dtype)


@pytest.mark.parametrize("isa", ISAS)
def test_matmul_integer(isa: str, monkeypatch, cache) -> None:
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    feeds = {}
    for at, bt in ((np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8), (np.int8, np.uint8)):
        # (64, 300, 129): B past a 48 KiB L1, so the tiles run row blocks innermost
        for m, k, n in ((1, 300, 70), (5, 33, 19), (64, 8, 129), (3, 1, 1), (64, 300, 129)):
            a = f"a_{np.dtype(at).name}_{m}_{k}"
            feeds.setdefault(a, _q(at, m, k))
            bconst = _q(bt, k, n)
            cases.add("MatMulInteger", [a], consts=(bconst,))  # no zero points
            cases.add("MatMulInteger", [a], consts=(bconst, at(np.iinfo(at).max), bt(np.iinfo(bt).min)))
            cases.add("MatMulInteger", [a], consts=(bconst, _q(at), _q(bt, n)))  # per column of B
            b = f"b_{np.dtype(bt).name}_{k}_{n}"  # B at run time
            feeds.setdefault(b, _q(bt, k, n))
            cases.add("MatMulInteger", [a, b])
            cases.add("MatMulInteger", [a, b], consts=(_q(at), bt(3)))
            cases.add("MatMulInteger", [a, b], consts=(_q(at), _q(bt, n)))  # run-time B, per column
    # batched A with a shared B, batched A and B
    feeds["a3"] = _q(np.uint8, 2, 3, 5, 17)
    feeds["b3"] = _q(np.int8, 2, 3, 17, 9)
    cases.add("MatMulInteger", ["a3"], consts=(_q(np.int8, 17, 9), np.uint8(128), np.int8(-2)))
    cases.add("MatMulInteger", ["a3", "b3"], consts=(np.uint8(7), np.int8(1)))
    check(cases, feeds, opset=21)


@pytest.mark.parametrize("isa", ISAS)
def test_qlinear_matmul(isa: str, monkeypatch, cache) -> None:
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    feeds = {"a": _q(np.uint8, 9, 40), "s": _q(np.int8, 9, 40), "v": _q(np.uint8, 1, 257), "bt": _q(np.int8, 40, 23)}
    f32 = np.float32
    # onnxruntime implements y of A's type (u8 A -> u8 y, s8 A -> s8 y)
    for y_scale in (f32(0.05), f32(3.0), f32(1e-4)):  # the last saturates nearly everything
        cases.add("QLinearMatMul", ["a"], consts=(f32(0.02), np.uint8(120), _q(np.int8, 40, 23), f32(0.01),
                                                  np.int8(0), y_scale, np.uint8(5)))
        cases.add("QLinearMatMul", ["s"], consts=(f32(0.02), np.int8(-7), _q(np.int8, 40, 23), f32(0.01),
                                                  np.int8(0), y_scale, np.int8(5)))
    cases.add("QLinearMatMul", ["s"], consts=(f32(0.03), np.int8(3), _q(np.int8, 40, 23),
                                              RNG.uniform(0.01, 0.05, 23).astype(f32), _q(np.int8, 23), f32(0.3),
                                              np.int8(0)))
    def with_run_time_b(a: str, b: str, params: tuple) -> None:
        """QLinearMatMul of ``a`` and the feed ``b``: B in the middle of the operand list."""
        names = []
        for v in params[:2] + (None,) + params[2:]:
            if v is None:
                names.append(b)
                continue
            names.append(f"r{len(cases.inits)}")
            cases.inits[names[-1]] = np.asarray(v)
        cases.add("QLinearMatMul", [a] + names)

    with_run_time_b("s", "bt", (f32(0.03), np.int8(-4), f32(0.02), np.int8(2), f32(0.5), np.int8(-1)))
    # attention in a QDQ transformer (Q K^T): both operands uint8 at run time, batched per head,
    # K odd and N past a register panel; B packed per call
    feeds["q4"], feeds["k4"] = _q(np.uint8, 1, 3, 13, 71), _q(np.uint8, 1, 3, 71, 67)
    with_run_time_b("q4", "k4", (f32(0.04), np.uint8(121), f32(0.03), np.uint8(133), f32(0.7), np.uint8(128)))
    # uint8 A and a run-time B: the quad form on VNNI hosts (B's bytes and column sums packed per
    # call): int8 B of zero point 0 (no row sums) and 5, uint8 B with scales per column, a shared
    # B under a batched A, M = 1 with K and N past and between panels
    with_run_time_b("a", "bt", (f32(0.02), np.uint8(120), f32(0.01), np.int8(0), f32(0.05), np.uint8(5)))
    with_run_time_b("a", "bt", (f32(0.02), np.uint8(0), f32(0.01), np.int8(5), f32(0.05), np.uint8(250)))
    feeds["bu"] = _q(np.uint8, 40, 23)
    with_run_time_b("a", "bu", (f32(0.02), np.uint8(255), RNG.uniform(0.005, 0.02, 23).astype(f32),
                                np.uint8(255), f32(0.3), np.uint8(0)))
    feeds["a3u"] = _q(np.uint8, 2, 3, 5, 40)
    with_run_time_b("a3u", "bu", (f32(0.02), np.uint8(17), f32(0.01), np.uint8(128), f32(0.2), np.uint8(9)))
    feeds["bv"] = _q(np.uint8, 257, 70)
    with_run_time_b("v", "bv", (f32(0.01), np.uint8(3), f32(0.01), np.uint8(200), f32(1.5), np.uint8(100)))
    check(cases, feeds, opset=21)


def test_unsupported_shapes_fall_back_with_a_reason() -> None:
    cases = Cases()
    cases.add("MatMulInteger", ["a"], consts=(_q(np.int8, 1, 3, 6),))  # B batch 1 broadcast to A's 2
    feeds = {"a": _q(np.uint8, 2, 5, 3)}
    model = build_model(cases, feeds, opset=21)
    compiled = smelt.compile(model, threads=1)
    [report] = compiled.fallback_report
    assert "batch" in report["reason"], report
    np.testing.assert_array_equal(compiled.run(feeds)[0], oracle(model, feeds)[0])


@pytest.mark.parametrize("isa", ISAS)
def test_matmul_integer_per_row_a_zero_point(isa: str, monkeypatch, cache) -> None:
    """ONNX allows a per-row zero point of A (a 1-D [M]); onnxruntime refuses it and
    onnx.reference fails to broadcast it, so the oracle is the definition in int64 numpy.
    Packed and run-time B, M below and above the register tile's rows."""
    force_isa(isa, monkeypatch, cache)
    cases = Cases()
    feeds, want = {}, []
    b_run = _q(np.int8, 21, 37)
    feeds["b"] = b_run
    for m in (1, 6, 13):
        a, az, bc, bz = _q(np.uint8, m, 21), _q(np.uint8, m), _q(np.int8, 21, 37), _q(np.int8, 37)
        feeds[f"a{m}"] = a
        cases.add("MatMulInteger", [f"a{m}"], consts=(bc, az, bz))
        want.append((a.astype(np.int64) - az[:, None].astype(np.int64)) @ (bc.astype(np.int64) - bz.astype(np.int64)))
        # B's zero point 0: the u8 x s8 quad form on VNNI hosts (A's zero points off afterwards)
        cases.add("MatMulInteger", [f"a{m}"], consts=(bc, az, np.zeros(37, np.int8)))
        want.append((a.astype(np.int64) - az[:, None].astype(np.int64)) @ bc.astype(np.int64))
        cases.add("MatMulInteger", [f"a{m}", "b"], consts=(az, np.int8(5)))
        want.append((a.astype(np.int64) - az[:, None].astype(np.int64)) @ (b_run.astype(np.int64) - 5))
    model = build_model(cases, feeds, opset=21)
    for threads in (1, 2):
        got = smelt.compile(model, threads=threads).run(feeds)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w.astype(np.int32))


def test_tile_rows_never_exceed_the_product() -> None:
    """An M-row product gets at most M tile rows (a classifier's M = 1 did six rows' dots), and
    the register budget's rows otherwise; the results at M = 1, 3, 5 and past a tile are checked
    against onnxruntime above (and QGemm's in test_qlinear_ops.py)."""
    from smelt.schedule.gemm import int_dot_tile

    assert int_dot_tile(32) == (6, 4) and int_dot_tile(16) == (6, 2)
    assert int_dot_tile(32, 1) == (1, 4) and int_dot_tile(16, 3) == (3, 2)
    assert int_dot_tile(32, 6) == (6, 4) and int_dot_tile(32, 1000) == (6, 4)
    assert int_dot_tile(32, 0) == (1, 4)  # an empty product still renders one row


def test_tile_order_streams_the_fewer_bytes() -> None:
    """Row blocks innermost where B is the bigger operand to stream (a transformer's FFN: A 128 x
    768, B 768 x 3072 int8); column panels innermost where B fits in the L1 (an im2col conv's few
    weights) or A is the bigger one (one row: B read once either way). Both orders run in the
    products checked above (M = 64, K = 300, N = 129 rows-inner; the smaller ones panels-inner)."""
    from smelt.schedule.gemm import int_tiles_rows_inner

    l1 = 48 << 10
    assert int_tiles_rows_inner(row_blocks=22, panels=48, a_bytes=128 * 768, b_bytes=768 * 3072, l1_bytes=l1)
    assert not int_tiles_rows_inner(row_blocks=2091, panels=2, a_bytes=12544 * 28, b_bytes=28 * 128, l1_bytes=l1)
    assert not int_tiles_rows_inner(row_blocks=1, panels=48, a_bytes=768, b_bytes=768 * 3072, l1_bytes=l1)


def test_narrow_products_trade_vectors_for_rows() -> None:
    """Fewer columns than a tile's vectors cover (ddddocr's 24-channel ConvIntegers under a
    64-column tile): NV covers the columns and the freed registers hold more rows, every
    accumulator, B vector and the A broadcast still in registers. The narrow tiles' answers are
    checked against onnxruntime in test_int_conv.py (7, 8, 9, 20 and 33 output channels)."""
    from smelt.schedule.gemm import INT_TILE_MAX_ROWS, int_dot_tile

    assert int_dot_tile(32, columns=24, lanes=16) == (12, 2)
    assert int_dot_tile(32, columns=16, lanes=16) == (INT_TILE_MAX_ROWS, 1)
    assert int_dot_tile(16, columns=8, lanes=8) == (INT_TILE_MAX_ROWS, 1)
    assert int_dot_tile(32, columns=64, lanes=16) == int_dot_tile(32) == int_dot_tile(32, columns=1000)
    for registers, lanes in ((32, 16), (16, 8)):
        for columns in range(1, 80):
            mr, nv = int_dot_tile(registers, columns=columns, lanes=lanes)
            assert mr * nv + nv + 1 <= registers and nv * lanes >= min(columns, int_dot_tile(registers)[1] * lanes)
