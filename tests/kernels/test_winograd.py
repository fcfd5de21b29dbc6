"""Winograd F(2x2, 3x3) convolutions (templates/winograd.py) against onnxruntime, at every
vector width this host runs: AVX-512 (16-lane blocks, a 2 x 14 GEMM tile) and AVX2 (8-lane
blocks, 2 x 6 within 16 registers; ``force_isa``).

Shapes hit every edge of the algorithm: even and odd output planes (ragged last tile row and
column, where only the outputs inside are stored), tile counts below, at and above the GEMM's
register tile (5, 6, 7, 13, 14, 15 and 29 tiles), a ragged output-channel tile (3 blocks with
2 per tile), input channels below one block (which stay direct), of one block and of 2 to 8
blocks, no padding, symmetric and asymmetric padding and padding wider than the kernel's reach
(patches entirely outside the image), batch 2, and every fused epilogue kind (bias, Relu, Clip,
per-channel Mul, Sigmoid, residual Add); 1 and 2 threads (``check_cases``). Small planes and
single input blocks are forced onto Winograd with ``winograd="always"``; the default threshold
is checked separately, as are ``compile(winograd=False)`` and the plan's record.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import Chain, _model, check_cases, force_isa

import smelt
from smelt.codegen.kernels.isa import vector_isa
from smelt.codegen.templates import winograd
from smelt.schedule.conv import winograd_thresholds
from smelt.target import detect

PAD1 = (1, 1, 1, 1)


@pytest.fixture(autouse=True)
def _vector_host():
    if not vector_isa(detect()).vector:
        pytest.skip("Winograd F(2x2,3x3) renders vector kernels (AVX2 or AVX-512)")


def _algorithms(compiled) -> dict[str, str]:
    return {i.node: i.schedule.get("algorithm", "") for i in compiled.plan.step_infos() if i.op == "Conv"}


def _expect_winograd(count: int, order: str):
    def check(compiled, target):
        infos = [i for i in compiled.plan.step_infos() if i.op == "Conv"]
        scheds = [i.schedule for i in infos]
        wino = [s for s in scheds if "Winograd" in s.get("algorithm", "")]
        # every legal conv, each once (the phased order is three steps of one node)
        assert len({i.node for i in infos if "Winograd" in i.schedule.get("algorithm", "")}) == count, scheds
        assert all(order in s.get("blocking", "") for s in wino), wino
    return check


def _cases():
    C = Chain
    # each chain starts with a 1x1 conv: Winograd reads blocked channels, not the plain input
    return [
        # 8-channel convs: one AVX2 block in and out; below AVX-512's block (they stay direct
        # there); 5, 6 and 7 tiles around AVX2's 6-wide register tile; 24 channels = 3 AVX2 blocks
        C("wg8c", (1, 8, 2, 10)).conv(8, (1, 1)).conv(8, (3, 3), pads=PAD1, post=("Relu",)).case(),
        C("wgt6", (1, 16, 2, 12)).conv(8, (1, 1)).conv(24, (3, 3), pads=PAD1).conv(16, (3, 3), pads=PAD1).case(),
        C("wgt7", (1, 24, 2, 14)).conv(24, (1, 1)).mark().conv(24, (3, 3), pads=PAD1, post=("residual",)).case(),
        # 128 input channels: 8 AVX2 blocks (a deeper reduction)
        C("wgdeep", (1, 128, 5, 6)).conv(128, (1, 1)).conv(32, (3, 3), pads=PAD1, post=("Relu",)).case(),
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


def _winograd_convs(cases, lanes: int) -> int:
    """The 3x3 convs of ``cases`` whose input and output channels fill whole blocks of
    ``lanes`` (each case's convs follow a blocked 1x1)."""
    n = 0
    for c in cases:
        weights = {t.name: list(t.dims) for t in c.inits}
        for node in c.nodes:
            w = weights[node.input[1]] if node.op_type == "Conv" else []
            n += w[2:] == [3, 3] and w[0] % lanes == 0 and w[1] % lanes == 0
    return n


@pytest.mark.parametrize("isa", ["native", "avx2"])
@pytest.mark.parametrize("banded", [True, False])
def test_winograd_chains(banded, isa, monkeypatch, cache):
    """Both orders: per-thread bands of tile rows (uneven bands, batch 2) and the three phased
    steps over whole planes (what big weights take); at both vector widths."""
    cases = _cases()
    target = force_isa(isa, monkeypatch, cache)
    n3x3 = _winograd_convs(cases, vector_isa(target).lanes)
    check_cases(cases, isa, monkeypatch, cache, _expect_winograd(n3x3, "bands" if banded else "phased"), layout="propagate",
                # wherever legal: below the cost thresholds too (small planes, one input block)
                winograd="always", schedule={"winograd_order": "banded" if banded else "phased"})


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_default_threshold(isa, monkeypatch, cache):
    """At the defaults Winograd takes exactly the convs at or above the target's thresholds
    (``schedule.conv.winograd_thresholds``: 196 positions and 32 channels with 32 registers,
    49 and 16 with AVX2's 16): 14x14 with 32 channels, 13x15 (195 positions), 16 input
    channels, a 6x8 plane (48 positions) and 8 input channels; all match onnxruntime."""
    target = force_isa(isa, monkeypatch, cache)
    min_plane, min_channels = winograd_thresholds(target)
    shapes = [("th14", 32, 14, 14), ("th13", 32, 13, 15), ("thc16", 16, 14, 14), ("th48", 32, 6, 8),
              ("thc8", 8, 14, 14)]
    cases = [Chain(n, (1, 32, h, w)).conv(c, (1, 1)).conv(32, (3, 3), pads=PAD1, post=("Relu",)).case()
             for n, c, h, w in shapes]
    lanes = vector_isa(target).lanes
    want = [h * w >= min_plane and c >= min_channels and c % lanes == 0 for _, c, h, w in shapes]
    assert want[0] and not want[3] and not want[4]  # the thresholds cut between these shapes

    def check(compiled, target):
        algos = list(_algorithms(compiled).values())
        assert [("Winograd" in a) for a in algos] == [x for w in want for x in (False, w)], algos

    check_cases(cases, isa, monkeypatch, cache, check, layout="propagate")


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_winograd_off_is_the_direct_sum(isa, monkeypatch, cache):
    """``compile(winograd=False)`` runs the direct kernel, and Winograd's answer differs from it
    by rounding only."""
    force_isa(isa, monkeypatch, cache)
    model, feeds = _model([Chain("off", (1, 64, 28, 28)).conv(64, (1, 1)).conv(64, (3, 3), pads=PAD1, post=("Relu",)).case()])
    fast = smelt.compile(model, threads=2)
    direct = smelt.compile(model, threads=2, winograd=False)
    assert any("Winograd" in a for a in _algorithms(fast).values())
    assert not any("Winograd" in a for a in _algorithms(direct).values())
    a, b = fast.run(feeds)[0], direct.run(feeds)[0]
    scale = float(np.max(np.abs(b)))
    assert float(np.max(np.abs(a - b))) <= 1e-5 * scale
    assert not np.array_equal(a, b)  # two algorithms, two roundings: the switch really switched


def test_winograd_order_follows_the_caches():
    """``winograd_choice``'s order from the target's caches: banded where the phased order's
    plane-sized buffers exceed twice the threads' L2 (a 900x161 plane), phased where the
    transformed weights exceed a quarter of L3 (512 channels: 16 MiB) whatever the plane; between, the
    weights against a quarter of L2 (a 28x28 plane with 128 channels: phased on a 1 MiB L2,
    banded on an 8 MiB one)."""
    import dataclasses

    from smelt.compiler import lower
    from smelt.frontend.onnx_import import load_model
    from smelt.options import CompileOptions
    from smelt.schedule.conv import winograd_choice

    def order(c: int, oc: int, h: int, w: int, l2: int, l3: int = 32 << 20) -> str:
        model, _ = _model([Chain("o", (1, c, h, w)).conv(oc, (3, 3), pads=PAD1).case()])
        opts = CompileOptions(threads=2, layout="propagate")
        target = dataclasses.replace(detect(), isa="avx512", vector_bits=512, vector_registers=32,
                                     l2_bytes=l2, l3_bytes=l3, physical_cores=2)
        g = lower(load_model(model), opts)
        conv = next(n for n in g.nodes if n.op == "Conv")
        for name in (conv.inputs[0], conv.outputs[0]):
            g.values[name].layout = "NCHW16c"
        return winograd_choice(conv, g, target, opts)

    mib = 1 << 20
    assert order(128, 64, 900, 161, mib) == "banded"  # phased: 450 MB of V and M
    assert order(512, 512, 900, 161, mib) == "phased"  # U 16 MiB > L3 / 4
    assert order(512, 512, 900, 161, mib, l3=128 * mib) == "banded"
    assert order(256, 512, 900, 161, mib) == "banded"  # U 8 MiB
    assert order(128, 128, 28, 28, mib) == "phased"  # U 1 MiB > L2 / 4; buffers 3.2 MB < 4 MiB
    assert order(128, 128, 28, 28, 8 * mib) == "banded"
    assert order(64, 64, 56, 56, mib) == "banded"  # buffers 6.4 MB > 4 MiB


def test_weight_transform_matches_definition():
    """U = G g Gᵀ, laid out [e][oc tile][C][J*16] with a narrower last tile."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((48, 16, 3, 3)).astype(np.float32)
    u = winograd.transform_weights(w, blocks=2, lanes=16)
    assert u.shape == (16, 48 * 16)
    # 8 lanes (AVX2): three tiles of J*8 = 16 output channels
    u8 = winograd.transform_weights(w, blocks=2, lanes=8).reshape(16, 3, 16, 16)
    G = winograd._G
    for e in (0, 5, 15):
        k, m = divmod(e, 4)
        want = np.einsum("i,ocij,j->co", G[k], w.astype(np.float64), G[m])  # [C, OC]
        tile0 = u[e, :16 * 32].reshape(16, 32)
        tile1 = u[e, 16 * 32:].reshape(16, 16)
        np.testing.assert_allclose(tile0, want[:, :32], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(tile1, want[:, 32:], rtol=1e-6, atol=1e-6)
        for t in range(3):
            np.testing.assert_allclose(u8[e, t], want[:, 16 * t:16 * t + 16], rtol=1e-6, atol=1e-6)
