"""Corrections to ``onnx.reference`` operators that fallback steps run.

``Loop``: onnx.reference joins the per-iteration scan outputs with ``np.vstack``, which turns
0-d values into an (N, 1) array and concatenates (a, b) values into (N*a, b); the ONNX spec (and
onnxruntime) stack them along a new leading axis: (N,) and (N, a, b). The subclass records the
per-iteration shape and reshapes the joined array (same elements in the same order).
"""

from __future__ import annotations

from onnx.reference.ops.op_loop import Loop as _ReferenceLoop


class Loop(_ReferenceLoop):
    """``onnx.reference``'s Loop with scan outputs stacked as the spec says."""

    def __init__(self, onnx_node, run_params) -> None:  # noqa: ANN001 - the parent's signature
        super().__init__(onnx_node, run_params)
        # the parent binds the body's runner as an instance attribute: wrap it to see the
        # per-iteration scan values
        run_body = self._run_body

        def recording_run_body(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            outputs = run_body(*args, **kwargs)
            if self.K > 0:
                self._scan_shapes = [tuple(getattr(v, "shape", ())) for v in outputs[-self.K:]]
                self._iterations += 1
            return outputs

        self._run_body = recording_run_body

    def _run(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        self._scan_shapes, self._iterations = [], 0
        res = list(super()._run(*args, **kwargs))
        if self.K > 0 and self._iterations:
            for k, shape in enumerate(self._scan_shapes):
                i = self.N + k
                res[i] = res[i].reshape((self._iterations, *shape))
        return tuple(res)


FIXED_OPS = [Loop]
