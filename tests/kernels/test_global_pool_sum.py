"""The blocked GlobalAveragePool's sum over a large plane, against a float64 mean.

PP-OCRv6's detector (wild:ppocr-v6-det) averages a 96 x 160 x 160 map in NCHW16c: one running
fp32 sum per lane over 25,600 positions drifted 1.3e-4 from the true mean (each add rounds
against an ever larger total), which put the model's output 1.4e-4 off onnxruntime. The sum is
now taken in chunks of ~sqrt(h*w) positions; here a mean near 2 over 160 x 160 must come out
within 2e-5 of float64, at every ISA the host runs, 1 and 2 threads, with planes that leave a
ragged last chunk.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import const, make_model, tensor
from kernel_models import force_isa
from onnx import helper

import smelt


def _model(c: int, h: int, w: int):
    # an identity 1x1 conv puts the input in the blocked layout without changing a bit of it
    weight = np.eye(c, dtype=np.float32).reshape(c, c, 1, 1)
    nodes = [helper.make_node("Conv", ["x", "w"], ["b"], name="conv"),
             helper.make_node("GlobalAveragePool", ["b"], ["y"], name="gap")]
    return make_model(nodes, [tensor("x", [1, c, h, w])], [tensor("y", [1, c, 1, 1])], [const("w", weight)])


@pytest.mark.parametrize("isa", ["native", "avx2", "scalar"])
@pytest.mark.parametrize("plane", [(160, 160), (97, 131), (7, 9)])
def test_blocked_global_average_pool_sums_accurately(isa, plane, monkeypatch, tmp_path):
    force_isa(isa, monkeypatch, tmp_path)
    h, w = plane
    c = 32
    # a page: a constant background (every add rounds the same way against the growing total:
    # the worst case for one running sum, 4e-4 off at 160 x 160) with noisy bars of "text"
    rng = np.random.default_rng(3)
    x = np.full((1, c, h, w), 2.1, np.float32) + np.arange(c, dtype=np.float32).reshape(1, c, 1, 1) / 7
    x[:, :, ::4] = rng.uniform(0.0, 3.0, x[:, :, ::4].shape)
    truth = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    for threads in (1, 2):
        compiled = smelt.compile(_model(c, h, w), threads=threads, layout="propagate")
        assert compiled.fallback_nodes == []
        templates = {i.schedule.get("template") for i in compiled.plan.step_infos()}
        if "global_pool_nchwc" not in templates:
            pytest.skip(f"{isa}: the pooling ran plain ({templates})")
        err = float(np.max(np.abs(compiled.run({"x": x})[0] - truth)))
        assert err < 1e-5 * 2.0, f"{isa}, {threads} threads, {h}x{w}: {err}"
        compiled.close()
