"""Model-local functions (``ModelProto.functions``) inlined at load.

A node calling a function the model itself defines (exporters write one per repeated module:
torch.onnx's ``export_modules_as_functions``, onnxscript) has no template and no schema, so
neither the native path nor onnx.reference's per-node fallback could run it: such models were
refused. onnx's inliner replaces every call by the function's body, nested calls and attribute
references (``ref_attr_name``) included, with unique value and node names (``<name>__<k>``); the
graph's inputs and outputs keep their names. The body's ops then meet the templates, or the
schema function expansion (``passes/expand_functions.py``), like any other node.
"""

from __future__ import annotations

import onnx

from smelt.errors import ModelLoadError


def inline_local_functions(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with every model-local function call replaced by its body (the same proto when
    the model defines no function; a new one otherwise, the caller's is not changed)."""
    if not proto.functions:
        return proto
    import onnx.inliner

    try:
        return onnx.inliner.inline_local_functions(proto)
    except Exception as exc:  # noqa: BLE001 - the inliner's C++ errors have no common type
        names = ", ".join(f"{f.domain}.{f.name}" for f in proto.functions)
        raise ModelLoadError(f"could not inline the model's local functions ({names}): {exc}") from exc
