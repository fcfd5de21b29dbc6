"""MatMul of float64, float16 and integer types (``matmul_generic``) against onnxruntime: 1-D
promotion, batch broadcasting, ragged and unit dims, at 1 and 2 threads and every ISA the host
runs (gcc vectorizes the inner loop differently per ISA)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_models import force_isa
from node_cases import Cases, check

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(20261128)
ISAS = ("native", "avx2", "scalar")
SHAPES = [((3, 5), (5, 7)), ((2, 1, 4, 9), (3, 9, 6)), ((9,), (9, 4)), ((4, 9), (9,)), ((9,), (9,)),
          ((1, 70), (70, 300)), ((2, 3, 1, 8), (8, 1))]


@pytest.mark.parametrize("isa", ISAS)
def test_matmul_generic(isa, monkeypatch, tmp_path) -> None:
    force_isa(isa, monkeypatch, tmp_path)
    cases, feeds = Cases(), {}
    for dt in ("float64", "float16", "int32", "int64", "uint32", "uint64"):
        for k, (sa, sb) in enumerate(SHAPES):
            a, b = f"a_{dt}_{k}", f"b_{dt}_{k}"
            if dt.startswith("float"):
                feeds[a], feeds[b] = (np.asarray(RNG.standard_normal(s)).astype(dt) for s in (sa, sb))
            else:  # large values: products and sums wrap, as onnxruntime's
                info = np.iinfo(dt)
                feeds[a], feeds[b] = (np.asarray(RNG.integers(info.min, info.max, s, dtype=dt, endpoint=True))
                                      for s in (sa, sb))
            cases.add("MatMul", [a, b])
    check(cases, feeds, opset=13)
