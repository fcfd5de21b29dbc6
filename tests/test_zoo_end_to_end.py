"""Every zoo model compiles fully native and matches onnxruntime at 1 thread and at all threads.

The small models run by default; the large CNNs and the remaining RNN variants are marked slow
(`pytest -m slow`, run by .ci/run).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from helpers import ort_run

import smelt
from smelt.frontend import zoo
from smelt.target import detect

FAST = ["resnet18", "squeezenet1_1", "mobilenet_v2", "lstm", "gru-bidirectional", "lstm-stacked",
        "gru-E64-H64-B10-T20"]
SLOW = ["resnet50", "vgg16", "densenet121", "inception_v3", "gru", "lstm-bidirectional", "gru-stacked",
        "lstm-E64-H64-B20-T100-L3-bi"]
ALL_THREADS = max(2, detect().physical_cores)


def _feeds(model) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input}


def _check(name: str) -> None:
    model = zoo.get_model(name)
    feeds = _feeds(model)
    want = ort_run(model, feeds, threads=ALL_THREADS)
    for threads in (1, ALL_THREADS):
        cm = smelt.compile(model, threads=threads)
        assert cm.fallback_nodes == [], cm.fallback_report
        got = cm.run(feeds)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            rel = float(np.max(np.abs(g - w))) / float(np.max(np.abs(w)))
            assert rel <= 1e-4, f"{name} threads={threads}: relative error {rel:.2e}"


@pytest.mark.parametrize("name", FAST)
def test_zoo_model_native_and_correct(name):
    _check(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_large_zoo_model_native_and_correct(name):
    _check(name)


def test_zoo_model_is_one_native_call_per_inference():
    model = zoo.get_model("resnet18")
    cm = smelt.compile(model, threads=ALL_THREADS)
    feeds = _feeds(model)
    cm.run(feeds)
    art = cm._current()
    assert [s[0] for s in art.steps] == ["native"]
    before = cm.native_calls
    cm.run(feeds)
    assert cm.native_calls == before + 1

    calls = []

    def prof(frame, event, arg):
        if event == "call":
            calls.append(frame.f_code.co_name)

    sys.setprofile(prof)
    try:
        cm.run(feeds)
    finally:
        sys.setprofile(None)
    # The Python work is input checks and one foreign call: far fewer calls than the 60+ operators,
    # and none of them is a per-operator kernel.
    assert len(calls) < 30, calls
