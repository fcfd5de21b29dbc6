"""Element types: the one place that maps ONNX tensor types to numpy and C types.

Native kernels are generated for the types listed in ``C_TYPES``; any other type (float16,
bfloat16, strings, complex) still loads and runs, through the reported fallback.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from smelt.errors import InvalidModelError

# numpy dtype name -> C type used in generated code.
C_TYPES: dict[str, str] = {
    "float32": "float",
    "float64": "double",
    "int8": "int8_t",
    "int16": "int16_t",
    "int32": "int32_t",
    "int64": "int64_t",
    "uint8": "uint8_t",
    "uint16": "uint16_t",
    "uint32": "uint32_t",
    "uint64": "uint64_t",
    "bool": "uint8_t",  # numpy bool is one byte holding 0 or 1
}

# Types that native kernels move as bits but never compute on directly: a float16 is a uint16_t
# in C, and templates that compute convert it to float and back (``codegen.kernels.half``).
# has_c_type stays False for them, so every template that computes refuses them unless it
# asks for them by name.
STORAGE_TYPES: dict[str, str] = {"float16": "uint16_t"}

FLOAT_TYPES = ("float32", "float64")
INT_TYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def np_dtype_from_onnx(elem_type: int) -> np.dtype:
    """The numpy dtype of an ONNX ``TensorProto`` element type."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError, TypeError) as exc:  # numpy knows every valid ONNX type
        raise InvalidModelError(f"{elem_type} is not an ONNX element type") from exc


def onnx_from_np_dtype(dtype: np.dtype) -> int:
    """The ONNX element type of a numpy dtype."""
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def onnx_type_string(dtype: np.dtype) -> str:
    """ORT-style type string, e.g. ``tensor(float)``."""
    name = onnx.TensorProto.DataType.Name(onnx_from_np_dtype(dtype)).lower()
    return f"tensor({name})"


def c_type(dtype: np.dtype | str) -> str:
    """The C type for a dtype (for a storage-only type, the unsigned integer holding its bits);
    raises KeyError for types with no native kernels."""
    name = np.dtype(dtype).name
    return C_TYPES[name] if name in C_TYPES else STORAGE_TYPES[name]


def has_c_type(dtype: np.dtype | str | None) -> bool:
    """Whether native kernels compute on this dtype directly (not float16: see STORAGE_TYPES)."""
    return dtype is not None and np.dtype(dtype).name in C_TYPES


def has_storage_type(dtype: np.dtype | str | None) -> bool:
    """Whether native kernels can hold (copy, move, select) this dtype: has_c_type or float16."""
    return dtype is not None and (np.dtype(dtype).name in C_TYPES or np.dtype(dtype).name in STORAGE_TYPES)
