"""Winograd F(2x2, 3x3) convolutions (templates/winograd.py) against onnxruntime.

Shapes hit every edge of the algorithm: even and odd output planes (ragged last tile row and
column, where only the outputs inside are stored), tile counts below, at and above the GEMM's
register tile (13, 14, 15 and 29 tiles), a ragged output-channel tile (3 blocks with 2 per
tile), input channels of 1 to 4 blocks, no padding, symmetric and asymmetric padding and
padding wider than the kernel's reach (patches entirely outside the image), batch 2, and every
fused epilogue kind (bias, Relu, Clip, per-channel Mul, Sigmoid, residual Add); 1 and 2 threads
(``check_cases``). Small planes and single input blocks are forced onto Winograd by lowering
``MIN_PLANE`` and ``MIN_CHANNELS``; the default
threshold is checked separately, as are ``compile(winograd=False)`` and the plan's record.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import Chain, _model, check_cases

import smelt
from smelt.codegen.templates import winograd
from smelt.target import detect

PAD1 = (1, 1, 1, 1)


@pytest.fixture(autouse=True)
def _avx512_only():
    if detect().isa != "avx512":
        pytest.skip("Winograd F(2x2,3x3) is an AVX-512 (16-lane) algorithm")


def _algorithms(compiled) -> dict[str, str]:
    return {i.node: i.schedule.get("algorithm", "") for i in compiled.plan.step_infos() if i.op == "Conv"}


def _expect_winograd(count: int, order: str):
    def check(compiled, target):
        scheds = [i.schedule for i in compiled.plan.step_infos() if i.op == "Conv"]
        wino = [s for s in scheds if "Winograd" in s.get("algorithm", "")]
        assert len(wino) >= count, scheds
        assert all(order in s.get("blocking", "") for s in wino), wino
    return check


def _cases():
    C = Chain
    # each chain starts with a 1x1 conv: Winograd reads 16-channel blocks, not the plain input
    return [
        # 8x8: 16 tiles (one full register tile + a 2-wide one), ragged oc tile (48 = 3 blocks),
        # residual + Relu on the second 3x3
        C("wg8", (1, 16, 8, 8)).conv(32, (1, 1)).conv(48, (3, 3), pads=PAD1, post=("Relu",)).mark()
        .conv(48, (3, 3), pads=PAD1, post=("residual", "Relu")).case(),
        # odd planes: 7x9 outputs -> 4x5 tiles, the last row and column half outside
        C("wg79", (1, 32, 7, 9)).conv(16, (1, 1)).mark().conv(16, (3, 3), pads=PAD1, post=("residual", "Relu"))
        .conv(32, (3, 3), pads=PAD1, post=("Clip",)).case(),
        # 13, 14, 15 and 29 tiles in one tile row (outputs 2 x 26/28/30/58)
        C("wgt13", (1, 16, 2, 26)).conv(32, (1, 1)).conv(16, (3, 3), pads=PAD1, post=("Sigmoid",)).case(),
        C("wgt14", (1, 16, 2, 28)).conv(48, (1, 1)).conv(32, (3, 3), pads=PAD1, post=("chan_mul",)).case(),
        C("wgt15", (1, 64, 2, 30)).conv(64, (1, 1)).conv(16, (3, 3), pads=PAD1).case(),
        C("wgt29", (1, 16, 4, 58)).conv(32, (1, 1)).conv(16, (3, 3), pads=PAD1, bias=False).case(),
        # no padding (10x10 out), asymmetric pads, padding beyond the kernel's reach, batch 2
        C("wgnp", (2, 16, 12, 12)).conv(32, (1, 1)).conv(32, (3, 3)).conv(16, (3, 3), pads=(0, 1, 2, 0), post=("Relu",))
        .conv(16, (3, 3), pads=(3, 2, 3, 2)).case(),
    ]


@pytest.mark.parametrize("banded", [True, False])
def test_winograd_chains(banded, monkeypatch, cache):
    """Both orders: per-thread bands of tile rows (uneven bands, batch 2) and the three phased
    steps over whole planes (what big weights take)."""
    cases = _cases()
    n3x3 = sum(1 for c in cases for n in c.nodes if n.op_type == "Conv"
               and [list(a.ints) for a in n.attribute if a.name == "kernel_shape"] == [[3, 3]])
    check_cases(cases, "native", monkeypatch, cache, _expect_winograd(n3x3, "bands" if banded else "phased"), layout="propagate",
                # wherever legal: below the cost thresholds too (small planes, one input block)
                winograd="always", schedule={"winograd_order": "banded" if banded else "phased"})


def test_default_threshold(monkeypatch, cache):
    """At the defaults a 14x14 plane with 32 input channels takes Winograd; a 13x15 one (195
    outputs) and one with 16 input channels stay direct; all match."""
    cases = [Chain("th14", (1, 32, 14, 14)).conv(32, (1, 1)).conv(32, (3, 3), pads=PAD1, post=("Relu",)).case(),
             Chain("th13", (1, 32, 13, 15)).conv(32, (1, 1)).conv(32, (3, 3), pads=PAD1, post=("Relu",)).case(),
             Chain("thc16", (1, 32, 14, 14)).conv(16, (1, 1)).conv(32, (3, 3), pads=PAD1).case()]

    def check(compiled, target):
        algos = list(_algorithms(compiled).values())
        assert [("Winograd" in a) for a in algos] == [False, True, False, False, False, False], algos

    check_cases(cases, "native", monkeypatch, cache, check, layout="propagate")


def test_winograd_off_is_the_direct_sum(monkeypatch, cache):
    """``compile(winograd=False)`` runs the direct kernel, and Winograd's answer differs from it
    by rounding only."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    model, feeds = _model([Chain("off", (1, 64, 28, 28)).conv(64, (1, 1)).conv(64, (3, 3), pads=PAD1, post=("Relu",)).case()])
    fast = smelt.compile(model, threads=2)
    direct = smelt.compile(model, threads=2, winograd=False)
    assert any("Winograd" in a for a in _algorithms(fast).values())
    assert not any("Winograd" in a for a in _algorithms(direct).values())
    a, b = fast.run(feeds)[0], direct.run(feeds)[0]
    scale = float(np.max(np.abs(b)))
    assert float(np.max(np.abs(a - b))) <= 1e-5 * scale
    assert not np.array_equal(a, b)  # two algorithms, two roundings: the switch really switched


def test_weight_transform_matches_definition():
    """U = G g Gᵀ, laid out [e][oc tile][C][J*16] with a narrower last tile."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((48, 16, 3, 3)).astype(np.float32)
    u = winograd.transform_weights(w, blocks=2, lanes=16)
    assert u.shape == (16, 48 * 16)
    G = winograd._G
    for e in (0, 5, 15):
        k, m = divmod(e, 4)
        want = np.einsum("i,ocij,j->co", G[k], w.astype(np.float64), G[m])  # [C, OC]
        tile0 = u[e, :16 * 32].reshape(16, 32)
        tile1 = u[e, 16 * 32:].reshape(16, 16)
        np.testing.assert_allclose(tile0, want[:, :32], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(tile1, want[:, 32:], rtol=1e-6, atol=1e-6)
