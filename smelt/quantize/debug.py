"""``debug_report``: the numeric debug table of a quantized model over given inputs (``numeric``
module doc), compiled here with ``smelt.compile``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import onnx

from smelt.errors import SmeltError
from smelt.quantize.numeric import DebugReport, NumericDebugModel


def debug_report(quantized: onnx.ModelProto, inputs: Iterable[Mapping[str, np.ndarray]],
                 float_model: onnx.ModelProto | None = None, *, threads: int | None = None) -> DebugReport:
    """Run the quantized model on smelt's integer kernels beside its float counterpart
    (``float_model``, else ``strip_activation_qdq(quantized)``) on ``inputs``; per quantized
    tensor the max and mean error, its SQNR, and how many elements the kernel producing it
    saturated (counted inside the kernel: what a float-side comparison cannot see). Worst SQNR
    first."""
    from smelt.api import compile as smelt_compile

    feeds = list(inputs)
    if not feeds:
        raise SmeltError("numeric debug needs at least one input")
    shapes = {k: list(np.shape(v)) for k, v in feeds[0].items()}
    model = NumericDebugModel(quantized, float_model,
                              lambda proto: smelt_compile(proto, threads=threads, input_shapes=shapes,
                                                           count_saturation=True))
    try:
        for feed in feeds:
            model.run(feed)
        return model.report()
    finally:
        model.close()
