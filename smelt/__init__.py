"""smelt: an optimizing compiler and runtime for neural-network inference on CPUs.

    import smelt
    model = smelt.compile("model.onnx")          # or an onnx.ModelProto / bytes
    y = model(x)                                   # numpy in, numpy out
    sess = smelt.InferenceSession("model.onnx")    # onnxruntime-compatible
    print(smelt.check("model.onnx").format_text()) # smelt vs onnxruntime, first diverging node
"""

# ``check`` the function shadows the module smelt.check (loaded by smelt.api first, so the name
# stays the function): import the module's names with ``from smelt.check import ...``
from smelt import quantize  # a callable package: smelt.quantize(model, calibration, ...)
from smelt.api import CompiledModel, InferenceSession, NodeArg, SessionOptions, check, compile
from smelt.check import CheckError, CheckReport, CheckWarning
from smelt.errors import (
    CompileError,
    CompilerNotFoundError,
    ModelLoadError,
    SmeltError,
    UnsupportedOpError,
)

__version__ = "0.1.0"

__all__ = [
    "CheckError", "CheckReport", "CheckWarning", "CompiledModel", "InferenceSession", "NodeArg",
    "SessionOptions", "check", "compile", "CompileError",
    "CompilerNotFoundError", "ModelLoadError", "SmeltError", "UnsupportedOpError", "__version__", "quantize",
]
