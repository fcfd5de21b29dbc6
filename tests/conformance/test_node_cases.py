"""ONNX backend node tests (generated from the installed onnx package) run through smelt.

Default run: every case of the ops the built-in zoo models use (Conv, BatchNormalization,
Relu, ..., LSTM, GRU, RNN; their ``*_expanded`` function-body variants included), compared
with the case's expected outputs. These must pass, natively or through the fallback. The two
Identity cases whose values are a sequence or an optional (not tensors) are skipped with the
reason: smelt's API takes and returns tensors only (see docs/conformance.md).

``-m slow``: every node test case. A case fails only if onnxruntime passes it and smelt does
not; cases onnxruntime fails (a newer IR version or opset than it loads, no CPU kernel, a
nondeterministic op, ...) are skipped with onnxruntime's error as the reason.

The summary across all cases, with failures grouped by op, is
``python tests/conformance/run_conformance.py`` (writes docs/conformance.md).
"""

from __future__ import annotations

import pytest

from conformance.cases import NodeCase, all_cases, run_ort, run_smelt, zoo_cases


def _describe(case: NodeCase, native: bool | None, fallback_ops: list[str]) -> str:
    how = {True: "ran natively", False: f"fallback for {', '.join(fallback_ops)}",
           None: "did not compile"}[native]
    return f"{case.name} (op {case.op}; smelt {how})"


@pytest.mark.parametrize("case", zoo_cases(), ids=lambda c: c.name)
def test_zoo_op_case(case: NodeCase) -> None:
    if not case.tensor_only:
        pytest.skip("sequence/optional graph inputs or outputs: smelt's API is tensor-only")
    error, native, fallback_ops = run_smelt(case)
    if error is not None:
        pytest.fail(f"{_describe(case, native, fallback_ops)}: {error}", pytrace=False)


# Cases smelt fails only because its fallback, onnx.reference, fails them (listed in
# docs/conformance.md). strict: when onnx.reference is fixed, the xfail turns into a failure.
FALLBACK_ORACLE_BUGS = {
    "test_if_opt": "onnx.reference nests the If's optional(sequence) output in an extra list",
}


def _params() -> list:
    return [pytest.param(c, id=c.name, marks=pytest.mark.xfail(strict=True, reason=FALLBACK_ORACLE_BUGS[c.name]))
            if c.name in FALLBACK_ORACLE_BUGS else pytest.param(c, id=c.name) for c in all_cases()]


@pytest.mark.slow
@pytest.mark.parametrize("case", _params())
def test_node_case(case: NodeCase) -> None:
    ort_error = run_ort(case)
    if ort_error is not None:
        pytest.skip(f"onnxruntime fails this case: {ort_error}")
    error, native, fallback_ops = run_smelt(case)
    if error is not None:
        pytest.fail(f"{_describe(case, native, fallback_ops)}; onnxruntime passes it: {error}", pytrace=False)
