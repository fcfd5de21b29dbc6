"""Gemm and MatMul templates against onnxruntime: every ragged edge of the blocked GEMM.

Sizes sit below, at and above each block of the AVX-512 kernel (MR=8, NR=48, KC=384 split in
balanced blocks, NC=672, MC=336 for run-time packed A), plus M/N/K = 1; run-time A is read in
place (row-major) or packed (transposed: whole when small, per block beyond 2 MB). Many independent cases
share one multi-output model so that one C compile covers them; each model runs at 1 and 2
threads (one library serves both) and is also generated for the AVX2 and portable-C kernels.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import const, make_model, tensor
from kernel_models import Case, _isa_target, _model, _rand, check_cases
from onnx import helper

import smelt
from smelt.codegen.kernels.isa import VEC_HEADER, vector_isa

RNG = np.random.default_rng(1234)


def gemm_case(name, m, n, k, ta=0, tb=0, alpha=1.0, beta=1.0, c=None, c_const=True, b_const=True,
              a_const=False, post=()) -> Case:
    p = name
    a_shape = (k, m) if ta else (m, k)
    b_shape = (n, k) if tb else (k, n)
    inputs, inits, feeds = [], [], {}

    def operand(nm, shape, is_const):
        arr = _rand(*shape)
        if is_const:
            inits.append(const(nm, arr))
        else:
            inputs.append(tensor(nm, list(shape)))
            feeds[nm] = arr

    operand(f"{p}_a", a_shape, a_const)
    operand(f"{p}_b", b_shape, b_const)
    ins = [f"{p}_a", f"{p}_b"]
    if c is not None:
        c_shape = {"scalar": (), "1": (1,), "n": (n,), "1n": (1, n), "m1": (m, 1), "mn": (m, n),
                   "11": (1, 1)}[c]
        operand(f"{p}_c", c_shape, c_const)
        ins.append(f"{p}_c")
    attrs = {}
    if ta:
        attrs["transA"] = 1
    if tb:
        attrs["transB"] = 1
    if alpha != 1.0:
        attrs["alpha"] = alpha
    if beta != 1.0:
        attrs["beta"] = beta
    nodes = [helper.make_node("Gemm", ins, [f"{p}_g"], **attrs)]
    out = _post(nodes, inputs, inits, feeds, f"{p}_g", p, post, (m, n), channel_axis=1)
    return Case(name, nodes, inputs, inits, out, feeds)


def _post(nodes, inputs, inits, feeds, cur, p, post, out_shape, channel_axis) -> str:
    """Append element-wise ops the fuse pass folds into the producer."""
    for i, op in enumerate(post):
        nxt = f"{p}_e{i}"
        if op in ("Relu", "Sigmoid", "Tanh", "HardSwish"):
            nodes.append(helper.make_node(op, [cur], [nxt]))
        elif op == "LeakyRelu":
            nodes.append(helper.make_node(op, [cur], [nxt], alpha=0.1))
        elif op == "HardSigmoid":
            nodes.append(helper.make_node(op, [cur], [nxt], alpha=0.3, beta=0.4))
        elif op == "Clip":
            inits += [const(f"{nxt}_lo", np.float32(-0.5)), const(f"{nxt}_hi", np.float32(0.7))]
            nodes.append(helper.make_node("Clip", [cur, f"{nxt}_lo", f"{nxt}_hi"], [nxt]))
        elif op == "SiLU":
            nodes.append(helper.make_node("Sigmoid", [cur], [f"{nxt}_s"]))
            nodes.append(helper.make_node("Mul", [cur, f"{nxt}_s"], [nxt]))
        else:  # "Add:full", "Sub:channel:swap", "Mul:scalar", "Div:channel", "Add:full:input"
            parts = op.split(":")
            kind, swap, runtime = parts[1], "swap" in parts, "input" in parts
            if kind == "full":
                shape = out_shape
            elif kind == "channel":
                shape = tuple(d if a == channel_axis else 1 for a, d in enumerate(out_shape))
                shape = shape[channel_axis:]  # numpy-style trailing broadcast
            else:
                shape = (1,)
            arr = _rand(*shape)
            if parts[0] == "Div":
                arr = np.where(np.abs(arr) < 0.2, 0.5, arr).astype(np.float32)
            if runtime:
                inputs.append(tensor(f"{nxt}_o", list(shape)))
                feeds[f"{nxt}_o"] = arr
            else:
                inits.append(const(f"{nxt}_o", arr))
            ins = [f"{nxt}_o", cur] if swap else [cur, f"{nxt}_o"]
            nodes.append(helper.make_node(parts[0], ins, [nxt]))
        cur = nxt
    return cur


def matmul_case(name, a_shape, b_shape, b_const=False, a_const=False, post=(), channel_axis=None) -> Case:
    p = name
    inputs, inits, feeds = [], [], {}
    for nm, shape, is_const in ((f"{p}_a", a_shape, a_const), (f"{p}_b", b_shape, b_const)):
        arr = _rand(*shape)
        if is_const:
            inits.append(const(nm, arr))
        else:
            inputs.append(tensor(nm, list(shape)))
            feeds[nm] = arr
    nodes = [helper.make_node("MatMul", [f"{p}_a", f"{p}_b"], [f"{p}_m"])]
    out_shape = np.matmul(np.zeros(a_shape, np.float32), np.zeros(b_shape, np.float32)).shape
    axis = len(out_shape) - 1 if channel_axis is None else channel_axis
    out = _post(nodes, inputs, inits, feeds, f"{p}_m", p, post, out_shape, axis)
    return Case(name, nodes, inputs, inits, out, feeds)


GEMM_CASES = [
    # block edges: MR=8, NR=48, KC=384, NC=672; M/N/K = 1
    gemm_case("g1x1x1", 1, 1, 1),
    gemm_case("g_fc", 1, 1000, 64, c="n", post=("Relu",)),
    # one row: 4 accumulator sets over k mod 4, a K tail of 3, K blocks past KC, a ragged vector
    gemm_case("g_fc_k_tail", 1, 70, 1543, c="n"),
    gemm_case("g_fc_rt", 1, 33, 7, b_const=False, post=("Relu",)),
    gemm_case("g7x47x5", 7, 47, 5),
    gemm_case("g8x48x16", 8, 48, 16, c="1n"),
    gemm_case("g9x49x17", 9, 49, 17, c="mn"),
    gemm_case("g17x97x385", 17, 97, 385, c="m1"),
    gemm_case("g16x96x768", 16, 96, 768, c="scalar"),
    gemm_case("g37x673x20", 37, 673, 20, c="n", post=("Relu",)),
    gemm_case("g3x1345x9", 3, 1345, 9),
    # N tails of 8 past whole 16-lane vectors (the AVX-512 column kernel) with ragged row groups
    gemm_case("g33x8x70", 33, 8, 70, c="m1"),
    gemm_case("g50x56x20", 50, 56, 20, post=("Relu",)),
    gemm_case("g19x72x40_rt", 19, 72, 40, b_const=False, c="n"),
    # run-time B (packed per call), run-time A beyond MC
    gemm_case("g_rtb", 23, 101, 53, b_const=False, c="n", c_const=False),
    gemm_case("g_rta_big", 339, 50, 30, b_const=False),
    gemm_case("g_consta", 13, 50, 30, a_const=True, b_const=False),
    # transposed run-time A beyond 2 MB: packed per (MC x KC) block, not whole
    gemm_case("g_tA_huge", 1100, 40, 520, ta=1, c="n"),
    # transposes, alpha/beta, C kinds
    gemm_case("g_tA", 11, 53, 19, ta=1, c="mn"),
    gemm_case("g_tB", 11, 53, 19, tb=1, c="n"),
    gemm_case("g_tAtB", 11, 53, 19, ta=1, tb=1, alpha=0.5, beta=2.0, c="1n"),
    gemm_case("g_tB_rt", 12, 50, 21, tb=1, b_const=False, alpha=-1.5),
    gemm_case("g_tA_rt_b", 10, 60, 19, ta=1, tb=1, b_const=False, c="m1", c_const=False, beta=0.25),
    gemm_case("g_beta0", 5, 20, 7, c="mn", beta=0.0),
    gemm_case("g_c11", 5, 20, 7, c="11", beta=-2.0),
    gemm_case("g_c1", 5, 20, 7, c="1", c_const=False),
    gemm_case("g_cmn_rt", 9, 50, 7, c="mn", c_const=False, alpha=2.0, beta=0.5, post=("Relu",)),
    # fused epilogues (vector path and scalar fallbacks)
    gemm_case("g_relu", 20, 70, 33, c="n", post=("Relu",)),
    gemm_case("g_clip", 20, 70, 33, post=("Clip",)),
    gemm_case("g_add_full", 20, 70, 33, c="n", post=("Add:full:input", "Relu")),
    gemm_case("g_sub_ch", 20, 70, 33, post=("Sub:channel:swap", "LeakyRelu")),
    gemm_case("g_mul_sc", 20, 70, 33, post=("Mul:scalar", "HardSigmoid")),
    gemm_case("g_div_ch", 20, 70, 33, post=("Div:channel", "HardSwish")),
    gemm_case("g_sigmoid", 20, 70, 33, post=("Sigmoid",)),
    gemm_case("g_silu", 20, 70, 33, c="n", post=("SiLU",)),
    gemm_case("g_tanh_add", 20, 70, 33, post=("Tanh", "Add:channel")),
]

MATMUL_CASES = [
    matmul_case("m_vec_mat", (37,), (37, 50)),
    matmul_case("m_mat_vec", (20, 37), (37,)),
    matmul_case("m_vec_vec", (37,), (37,)),
    matmul_case("m_batched", (2, 3, 9, 17), (2, 3, 17, 49)),
    matmul_case("m_bcast_a", (2, 1, 9, 17), (3, 17, 50)),
    matmul_case("m_bcast_b", (4, 9, 17), (1, 17, 20)),
    matmul_case("m_shared_b", (3, 5, 17), (17, 50), b_const=True, post=("Add:channel", "Relu")),
    matmul_case("m_a2d_bbatch", (9, 17), (3, 17, 20)),
    matmul_case("m_const_b_batched", (2, 9, 17), (2, 17, 50), b_const=True),
    matmul_case("m_const_a", (9, 17), (17, 20), a_const=True),
    matmul_case("m_big", (65, 400), (400, 100), b_const=True, post=("Add:full",)),
    matmul_case("m_vec_chan", (3, 6, 17), (17,), post=("Add:channel",)),
    matmul_case("m_1x1", (1, 1), (1, 1)),
]


def _check(cases: list[Case], isa: str, monkeypatch, cache, **compile_kw) -> None:
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)
    def structure(compiled, target):
        assert f"__{target.isa}_" in compiled.source_path.read_text()  # the kernels asked for

    check_cases(cases, isa, monkeypatch, cache, structure, **compile_kw)


def test_fused_graphs_have_no_standalone_epilogue(monkeypatch, cache):
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)
    case = gemm_case("fuse", 4, 40, 8, c="n", post=("Relu",))
    model, feeds = _model([case])
    compiled = smelt.compile(model, threads=2)
    assert [op for _, op in compiled.native_nodes] == ["Gemm"]
    src = compiled.source_path.read_text()
    assert "template: f32_gemm_" in src


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
def test_gemm(isa, monkeypatch, cache):
    _check(GEMM_CASES if isa == "native" else GEMM_CASES[::2], isa, monkeypatch, cache)


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
def test_matmul(isa, monkeypatch, cache):
    _check(MATMUL_CASES, isa, monkeypatch, cache)


def test_large_gemm_both_runtime(monkeypatch, cache):
    """Square GEMM with several K blocks, both operands packed at run time, two threads."""
    _check([matmul_case("sq", (200, 800), (800, 300)), gemm_case("sq_c", 130, 700, 400, c="n")],
           "native", monkeypatch, cache)


def test_integer_matmul_runs_on_the_generic_template(monkeypatch, cache):
    """int32 MatMul is not the float GEMM's: matmul_generic.py runs it (wrapping sums)."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                       [tensor("a", [3, 4], 6), tensor("b", [4, 5], 6)], [tensor("y", [3, 5], 6)])
    compiled = smelt.compile(model, threads=1)
    assert compiled.fallback_nodes == []
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    b = np.arange(20, dtype=np.int32).reshape(4, 5)
    np.testing.assert_array_equal(compiled(a, b), a @ b)


def test_empty_operands_fold_and_answer(monkeypatch, cache):
    """A MatMul whose constant B has N = 0, and a Gemm with M = 0: no template renders them (the
    MatMul template reshaped the empty B and raised a ValueError: fuzz seed 0, iteration 3074);
    their outputs are statically empty, so constant folding makes them constants."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm"),
                        helper.make_node("Gemm", ["e", "c"], ["z"], name="gemm")],
                       [tensor("a", [3, 5]), tensor("e", [0, 4])], [tensor("y", None), tensor("z", None)],
                       [const("b", np.zeros((5, 0), np.float32)), const("c", np.ones((4, 2), np.float32))])
    compiled = smelt.compile(model, threads=1)
    assert compiled.fallback_nodes == []
    y, z = compiled(np.ones((3, 5), np.float32), np.ones((0, 4), np.float32))
    assert y.shape == (3, 0) and z.shape == (0, 2)


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_vector_exp_epilogues_accuracy(isa, monkeypatch, cache):
    """Sigmoid / Tanh / SiLU epilogues use a vector expf: check them over a wide range."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)
    target = _isa_target(isa)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    xs = np.concatenate([np.linspace(-100, 100, 2001), np.linspace(-1e-3, 1e-3, 101),
                         [0.0, -0.0, 87.5, -87.5, 89.0, -89.0, 1e-30, -1e-30]]).astype(np.float32)
    n = xs.size
    nodes, outputs = [], []
    for op in ("Sigmoid", "Tanh", "SiLU"):
        nodes.append(helper.make_node("Gemm", ["one", "xs"], [f"g_{op}"]))
        if op == "SiLU":
            nodes += [helper.make_node("Sigmoid", [f"g_{op}"], [f"s_{op}"]),
                      helper.make_node("Mul", [f"g_{op}", f"s_{op}"], [f"y_{op}"])]
        else:
            nodes.append(helper.make_node(op, [f"g_{op}"], [f"y_{op}"]))
        outputs.append(tensor(f"y_{op}", [1, n]))
    model = make_model(nodes, [tensor("one", [1, 1])], outputs, [const("xs", xs.reshape(1, n))])
    compiled = smelt.compile(model, threads=1)
    assert [op for _, op in compiled.native_nodes] == ["Gemm"] * 3
    exp_fn, src = vector_isa(target).exp_fn, compiled.source_path.read_text()
    assert exp_fn and src.count(f"{exp_fn}(") > VEC_HEADER.read_text().count(f"{exp_fn}("), "no vector expf call"
    got = compiled.run({"one": np.ones((1, 1), np.float32)})
    x = xs.astype(np.float64)
    sig = 1.0 / (1.0 + np.exp(-x))
    for g, w in zip(got, (sig, np.tanh(x), x * sig), strict=True):
        g = g.reshape(-1).astype(np.float64)
        assert np.all(np.abs(g - w) <= 1e-6 * np.maximum(1.0, np.abs(w)) + 1e-7), np.max(np.abs(g - w))


def test_direct_b_variant(monkeypatch, tmp_path):
    """The (disabled by default) in-place B reading path: kernels read run-time B rows directly."""
    by_name = {c.name: c for c in GEMM_CASES + MATMUL_CASES}
    cases = [by_name[n] for n in ("g_rtb", "g_rta_big", "m_batched", "m_bcast_a")]
    _check(cases + [matmul_case("d_tail", (17, 30), (30, 49))], "native", monkeypatch, tmp_path,
           schedule={"gemm_read_b_in_place": True})


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_packed_a_and_no_c_prefetch(isa, monkeypatch, tmp_path):
    """The schedule switches ``gemm_read_a_in_place=False`` (a run-time row-major A is packed
    into MR-row panels instead of read in place) and ``gemm_prefetch_c=False`` (no C-tile
    prefetch before the K loop): the same answers, and the kernels really changed."""
    by_name = {c.name: c for c in GEMM_CASES + MATMUL_CASES}
    cases = [by_name[n] for n in ("g_rtb", "g_rta_big", "m_batched", "m_bcast_a", "m_big")]
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)
    c_prefetch = "_mm_prefetch((const char *)(C + r * ldc"

    def structure(compiled, target):
        src = compiled.source_path.read_text()
        assert "f32_gemm_ukrA_" not in src and "f32_gemm_ukr_" in src
        assert c_prefetch not in src

    check_cases(cases, isa, monkeypatch, tmp_path / "off", structure,
                schedule={"gemm_read_a_in_place": False, "gemm_prefetch_c": False})

    def defaults(compiled, target):  # the same cases at the defaults do read A in place and prefetch C
        src = compiled.source_path.read_text()
        assert "f32_gemm_ukrA_" in src and c_prefetch in src

    check_cases(cases[1:2], isa, monkeypatch, tmp_path / "on", defaults)


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_next_b_block_prefetch(isa, monkeypatch, tmp_path):
    """Prepacked weights: each micro-kernel call prefetches its share of the next B block (the
    next K block, then the next NC block) into L2 (``gemm_prefetch_next_b``, on by default).
    Cases past KC (two and five K blocks), past NC, one row and a ragged N: the same answers with
    the prefetch and without it, and the kernels really differ."""
    by_name = {c.name: c for c in GEMM_CASES}
    cases = [by_name[n] for n in ("g17x97x385", "g16x96x768", "g3x1345x9", "g_fc_k_tail", "g37x673x20")]
    monkeypatch.setenv("SMELT_DEBUG", "1")  # keeps the generated C (source_path)
    share = "_mm_prefetch((const char *)(pf), _MM_HINT_T1)"

    def on(compiled, target):
        src = compiled.source_path.read_text()
        assert "bnext = bptr + kb *" in src and share in src

    def off(compiled, target):
        assert "bnext" not in compiled.source_path.read_text()

    check_cases(cases, isa, monkeypatch, tmp_path / "on", on)
    check_cases(cases[:2], isa, monkeypatch, tmp_path / "off", off, schedule={"gemm_prefetch_next_b": False})


def test_gemm_switches_are_in_the_key():
    """Every GEMM and conv kernel switch is a CompileOptions field that changes the artifact key."""
    from smelt.options import CompileOptions
    from smelt.target import detect

    t = detect()
    base = CompileOptions(threads=1)
    for name in ("gemm_read_a_in_place", "gemm_prefetch_c", "gemm_prefetch_next_b", "conv_prefetch_input",
                 "conv_prefetch_weights", "conv_row_split", "conv_column_pairs"):
        flipped = CompileOptions(threads=1, **{name: not getattr(base, name)})
        assert flipped.key(t) != base.key(t), name
