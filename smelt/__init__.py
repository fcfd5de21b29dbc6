"""smelt: an optimizing compiler and runtime for neural-network inference on CPUs.

    import smelt
    model = smelt.compile("model.onnx")          # or an onnx.ModelProto / bytes
    y = model(x)                                   # numpy in, numpy out
    sess = smelt.InferenceSession("model.onnx")    # onnxruntime-compatible
"""

from smelt.api import CompiledModel, InferenceSession, NodeArg, SessionOptions, compile
from smelt.errors import (
    CompileError,
    CompilerNotFoundError,
    ModelLoadError,
    SmeltError,
    UnsupportedOpError,
)

__version__ = "0.1.0"

__all__ = [
    "CompiledModel", "InferenceSession", "NodeArg", "SessionOptions", "compile", "CompileError",
    "CompilerNotFoundError", "ModelLoadError", "SmeltError", "UnsupportedOpError", "__version__",
]
