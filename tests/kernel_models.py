"""Shared pieces of the GEMM and convolution kernel tests: cases packed into one model, and
forcing a vector ISA so the AVX2 and portable templates are tested on this host too."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import make_model, ort_run
from onnx import helper

from smelt.target import detect

RNG = np.random.default_rng(20261122)


def _rand(*shape) -> np.ndarray:
    return RNG.uniform(-1, 1, shape).astype(np.float32)


@dataclasses.dataclass
class Case:
    name: str
    nodes: list
    inputs: list
    inits: list
    output: str
    feeds: dict



def _model(cases: list[Case]):
    nodes, inputs, inits, outputs, feeds = [], [], [], [], {}
    for c in cases:
        nodes += c.nodes
        inputs += c.inputs
        inits += c.inits
        outputs.append(helper.make_tensor_value_info(c.output, 1, None))
        feeds.update(c.feeds)
    return make_model(nodes, inputs, outputs, inits), feeds


def _isa_target(isa: str):
    real = detect()
    if isa == "native":
        return real
    if isa == "avx2":
        if "avx2" not in real.flags or real.arch != "x86_64":
            pytest.skip("host has no AVX2")
        return dataclasses.replace(real, isa="avx2", vector_bits=256, vector_registers=16)
    return dataclasses.replace(real, isa="scalar", vector_bits=32, vector_registers=16)


def check_cases(cases: list[Case], isa: str, monkeypatch, cache, check_compiled, layout: str = "nchw") -> None:
    """Compile the cases for ``isa`` at 1 and 2 threads and compare every output with onnxruntime.

    ``check_compiled(compiled, target)`` adds the caller's structural assertions. ``layout``: the
    layout planning mode (default "nchw": the plain-layout templates; "propagate" for NCHWc).
    """
    import smelt

    monkeypatch.setenv("SMELT_CACHE_DIR", str(cache))
    target = _isa_target(isa)
    monkeypatch.setattr("smelt.compiler.detect", lambda: target)
    model, feeds = _model(cases)
    want = ort_run(model, feeds)
    first = None
    for threads in (1, 2):
        compiled = smelt.compile(model, threads=threads, layout=layout)
        assert compiled.fallback_nodes == []
        check_compiled(compiled, target)
        got = compiled.run(feeds)
        if first is None:
            first = got
        else:  # every element is accumulated in the same order whatever the thread split
            for c, a, b in zip(cases, first, got, strict=True):
                np.testing.assert_array_equal(a, b, err_msg=c.name)
        for c, g, w in zip(cases, got, want, strict=True):
            assert g.shape == w.shape, (c.name, g.shape, w.shape)
            scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
            err = float(np.max(np.abs(g.astype(np.float64) - w))) if w.size else 0.0
            assert err <= 1e-4 * scale, f"{c.name} ({isa}, threads={threads}): max abs error {err}"
        compiled.close()
