"""ONNX backend node-test cases, run through smelt and through onnxruntime.

The cases are generated offline from the installed ``onnx`` package
(``onnx.backend.test.case.node.collect_testcases``), so no test data needs to be downloaded.
Each case is one model (a single node, or for ``*_expanded`` cases the node's function body)
plus one or more ``(inputs, expected_outputs)`` data sets and the tolerances the ONNX backend
runner uses. Outputs are compared exactly like ``onnx.backend.test.runner`` does: same number
of outputs, same shapes, same dtypes, then ``np.testing.assert_allclose(rtol, atol)``;
sequence outputs are compared element by element and an empty optional must come back None.

``run_case(case)`` returns a :class:`CaseResult` with, for each engine, pass/fail and the first
line of the error, and for smelt whether every node ran natively (no ``onnx.reference``
fallback node in ``session.compiled.fallback_nodes``).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

# The ops the built-in zoo models use: every case of these is in the default (fast) run.
ZOO_OPS = (
    "Conv", "BatchNormalization", "Relu", "Clip", "Add", "Mul", "Sigmoid", "MaxPool",
    "AveragePool", "GlobalAveragePool", "Concat", "Flatten", "Reshape", "Gemm", "MatMul",
    "Dropout", "Identity", "Softmax", "Transpose", "Squeeze", "Unsqueeze", "LSTM", "GRU", "RNN",
)

_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


@dataclass(frozen=True)
class NodeCase:
    """One backend node test: ``op`` is the operator under test (for expanded cases too)."""

    name: str
    op: str
    model: onnx.ModelProto = field(repr=False, compare=False)
    data_sets: list = field(repr=False, compare=False)
    rtol: float
    atol: float

    @property
    def expanded(self) -> bool:
        return bool(_EXPANDED.search(self.name))

    @property
    def tensor_only(self) -> bool:
        """True when every graph input and output is a tensor (no sequence, optional or map)."""
        vis = list(self.model.graph.input) + list(self.model.graph.output)
        return all(vi.type.HasField("tensor_type") for vi in vis)


@dataclass
class CaseResult:
    name: str
    op: str
    ort_pass: bool
    ort_error: str | None
    smelt_pass: bool
    smelt_error: str | None
    smelt_native: bool | None  # True: no fallback node; None: smelt did not get to compile it
    fallback_ops: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


@functools.cache
def all_cases() -> tuple[NodeCase, ...]:
    """Every node test case of the installed onnx, collected once per process (quietly)."""
    from onnx.backend.test.case import node as node_cases

    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        raw = list(node_cases.collect_testcases(None))
    op_of = {}
    for c in raw:
        if not _EXPANDED.search(c.name) and c.model.graph.node:
            op_of[c.name] = c.model.graph.node[0].op_type
    cases = []
    for c in raw:
        base = _EXPANDED.sub("", c.name)
        op = op_of.get(base) or (c.model.graph.node[0].op_type if c.model.graph.node else "?")
        cases.append(NodeCase(c.name, op, c.model, list(c.data_sets), float(c.rtol), float(c.atol)))
    return tuple(sorted(cases, key=lambda c: c.name))


@functools.cache
def cases_by_name() -> dict[str, NodeCase]:
    return {c.name: c for c in all_cases()}


def zoo_cases() -> list[NodeCase]:
    """The cases of the ops the zoo models use, expanded (function-body) variants included."""
    return [c for c in all_cases() if c.op in ZOO_OPS]


# -- values -----------------------------------------------------------------------------------
def normalize(value: Any) -> Any:
    """TensorProto / numpy scalar -> ndarray; sequences element-wise; None (empty optional) kept."""
    if value is None:
        return None
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list | tuple):
        return [normalize(v) for v in value]
    if isinstance(value, np.ndarray):
        return value
    return np.asarray(value)


def _input_names(model: onnx.ModelProto) -> list[str]:
    inits = {i.name for i in model.graph.initializer}
    return [vi.name for vi in model.graph.input if vi.name not in inits]


def feeds_for(model: onnx.ModelProto, inputs: Sequence[Any]) -> dict[str, Any]:
    names = _input_names(model)
    return dict(zip(names, (normalize(x) for x in inputs), strict=False))


def assert_similar_outputs(ref_outputs: Sequence[Any], outputs: Sequence[Any], rtol: float,
                           atol: float) -> None:
    """onnx.backend.test.runner.Runner.assert_similar_outputs, plus empty optionals (None)."""
    np.testing.assert_equal(len(outputs), len(ref_outputs))
    for i, (out, ref) in enumerate(zip(outputs, ref_outputs, strict=True)):
        if ref is None or out is None:
            if not (ref is None and out is None):
                raise AssertionError(f"output {i}: expected {type(ref).__name__}, got {type(out).__name__}")
            continue
        if isinstance(ref, list | tuple):
            if not isinstance(out, list | tuple):
                raise AssertionError(f"output {i}: expected a sequence, got {type(out).__name__}")
            assert_similar_outputs(list(ref), list(out), rtol, atol)
            continue
        if isinstance(out, list | tuple):
            raise AssertionError(f"output {i}: expected a tensor, got a sequence")
        out, ref = np.asarray(out), np.asarray(ref)
        np.testing.assert_array_equal(out.shape, ref.shape, err_msg=f"Output {i} has incorrect shape")
        if ref.dtype == object:
            np.testing.assert_array_equal(out, ref)
            continue
        np.testing.assert_equal(out.dtype, ref.dtype)
        out_rtol = rtol
        if out.dtype.name == "bfloat16":
            out_rtol = max(rtol, 2**-6)
            out, ref = out.astype(np.float32), ref.astype(np.float32)
        np.testing.assert_allclose(out, ref, rtol=out_rtol, atol=atol)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # assert_allclose / assert_equal put the useful part after a generic header line
    if lines and lines[0].startswith(("Not equal to tolerance", "Arrays are not", "Items are not")):
        detail = next((ln for ln in lines[1:] if ln.startswith(("Mismatch", "Mismatched", "x:", "ACTUAL"))), "")
        head = f"{lines[0]} {detail}".strip()
    elif lines and lines[0].startswith("Output") and len(lines) > 1:
        head = f"{lines[0]} {lines[1]}" if "shape" in lines[0] else lines[0]
    else:
        head = lines[0] if lines else ""
    msg = f"{type(exc).__name__}: {head}" if head else type(exc).__name__
    return msg[:300]


# -- engines ----------------------------------------------------------------------------------
def run_ort(case: NodeCase) -> str | None:
    """Run ``case`` through onnxruntime (CPU); None when it passes, else the first error line."""
    try:
        import onnxruntime as ort
    except ImportError as exc:  # pragma: no cover - the test extra installs it
        return f"onnxruntime not installed: {exc}"
    try:
        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        opts.intra_op_num_threads = 1
        sess = ort.InferenceSession(case.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        return "load: " + first_line(exc)
    try:
        for inputs, ref_outputs in case.data_sets:
            outs = sess.run(None, feeds_for(case.model, inputs))
            assert_similar_outputs([normalize(r) for r in ref_outputs], outs, case.rtol, case.atol)
    except Exception as exc:
        return first_line(exc)
    return None


def smelt_threads() -> int:
    """Threads for smelt sessions: $SMELT_CONFORMANCE_THREADS, else smelt's default (0)."""
    return int(os.environ.get("SMELT_CONFORMANCE_THREADS", "0") or 0)


def run_smelt(case: NodeCase) -> tuple[str | None, bool | None, list[str]]:
    """Run ``case`` through ``smelt.InferenceSession``.

    Returns (error or None, ran fully native?, ops of the fallback nodes). Native-ness is
    None when smelt failed before it compiled the model.
    """
    import smelt

    opts = smelt.SessionOptions()
    opts.intra_op_num_threads = smelt_threads()

    native: bool | None = None
    fallback_ops: list[str] = []
    sess = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sess = smelt.InferenceSession(case.model, opts)
            for inputs, ref_outputs in case.data_sets:
                try:
                    outs = sess.run(None, feeds_for(case.model, inputs))
                finally:
                    if sess.compiled.built:  # a call that failed before its build: nothing to say
                        report = sess.compiled.fallback_report
                        fallback_ops = sorted({f["op"] for f in report})
                        native = not report
                assert_similar_outputs([normalize(r) for r in ref_outputs], outs, case.rtol, case.atol)
    except Exception as exc:
        return first_line(exc), native, fallback_ops
    finally:
        if sess is not None:
            sess.compiled.close()
    return None, native, fallback_ops


def run_case(case: NodeCase, *, ort: bool = True) -> CaseResult:
    start = time.perf_counter()
    ort_error = run_ort(case) if ort else "not run"
    smelt_error, native, fallback_ops = run_smelt(case)
    return CaseResult(case.name, case.op, ort_error is None, ort_error, smelt_error is None, smelt_error,
                      native, fallback_ops, time.perf_counter() - start)
