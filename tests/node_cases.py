"""Many single-node cases in one ONNX model, compared against onnxruntime at 1 and 2 threads.

Shared by the kernel tests: one compile serves dozens of cases.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import smelt

ort = pytest.importorskip("onnxruntime")


class Cases:
    """Single-node cases collected into one model."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.outputs: list[str] = []
        self.inits: dict[str, np.ndarray] = {}

    def add(self, op: str, inputs: list[str], consts: tuple = (), n_out: int = 1, **attrs) -> list[str]:
        names = list(inputs)
        for c in consts:
            if c is None:
                names.append("")
                continue
            cname = f"c{len(self.inits)}"
            self.inits[cname] = np.asarray(c)
            names.append(cname)
        outs = [f"{op.lower()}_{len(self.nodes)}_{k}" for k in range(n_out)]
        self.nodes.append(helper.make_node(op, names, outs, name=f"{op}_{len(self.nodes)}", **attrs))
        self.outputs += outs
        return outs


def build_model(cases: Cases, feeds: dict[str, np.ndarray], opset: int = 17) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
              for k, v in feeds.items()]
    graph = helper.make_graph(cases.nodes, "cases", inputs,
                              [helper.make_empty_tensor_value_info(o) for o in cases.outputs],
                              initializer=[numpy_helper.from_array(v, k) for k, v in cases.inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    del model.graph.output[:]
    model.graph.output.extend(types[o] for o in cases.outputs)
    return model


def oracle(model: onnx.ModelProto, feeds: dict[str, np.ndarray], kind: str = "ort") -> list[np.ndarray]:
    if kind == "ort":
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        results = sess.run(None, feeds)
    else:
        from onnx.reference import ReferenceEvaluator

        results = ReferenceEvaluator(model).run(None, feeds)
    # declare the oracle's output shapes (onnx's shape inference ignores ceil_mode's last-window rule)
    for vi, r in zip(model.graph.output, results, strict=True):
        dims = vi.type.tensor_type.shape.dim
        del dims[:]
        for d in np.shape(r):
            dims.add().dim_value = d
    return [np.asarray(r) for r in results]


def assert_close(name: str, got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, want.shape, got.dtype, want.dtype)
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=name)
        return
    finite = np.abs(want[np.isfinite(want)])
    tol = 1e-5 * max(1.0, float(finite.max()) if finite.size else 1.0)
    # NaN where onnxruntime has NaN, an infinity of the same sign where it has one (equality),
    # the finite values within tol; a NaN against a number is an error, not a NaN difference
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    with np.errstate(invalid="ignore"):
        err = np.where(same, 0.0, np.abs(got.astype(np.float64) - want.astype(np.float64)))
    bad = ~(err <= tol)
    if bad.any():
        at = [tuple(i) for i in np.argwhere(bad)[:3].tolist()]
        raise AssertionError(f"{name}: {int(bad.sum())} elements differ beyond {tol:.3g}, e.g. at {at}: "
                             f"got {[got[i] for i in at]}, want {[want[i] for i in at]}")


def check(cases: Cases, feeds: dict[str, np.ndarray], opset: int = 17, kind: str = "ort",
          fallback: tuple[str, ...] = (), transform=None, **options) -> None:
    """Compare all outputs at 1 and 2 threads; only the nodes named in ``fallback`` may fall back.
    ``options`` go to ``smelt.compile`` (e.g. ``layout``); ``transform`` rewrites the model smelt
    compiles (e.g. smelt-only node attributes the oracle would reject)."""
    model = build_model(cases, feeds, opset)
    want = oracle(model, feeds, kind)
    ours = transform(model) if transform is not None else model
    errors = []  # every failing output, not just the first
    for threads in (1, 2):
        compiled = smelt.compile(ours, threads=threads, **options)
        got = compiled.run(feeds)  # first: a model with value guards builds at its first call
        assert sorted(compiled.fallback_nodes) == sorted(fallback), compiled.fallback_report
        for name, g, w in zip(cases.outputs, got, want, strict=True):
            try:
                assert_close(f"{name} (threads={threads})", g, w)
            except AssertionError as exc:
                errors.append(str(exc))
        compiled.close()
    assert not errors, "\n".join(errors)
