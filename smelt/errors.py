"""Exceptions smelt raises. Every message names what is wrong: the file, node, op or input."""

from __future__ import annotations


class SmeltError(Exception):
    """Base class of smelt's errors."""


class ModelLoadError(SmeltError, ValueError):
    """The model file or bytes could not be read as an ONNX model."""


class UnsupportedOpError(SmeltError):
    """A node has no native template and cannot fall back."""

    def __init__(self, op: str, node: str, reason: str) -> None:
        super().__init__(f"cannot run node {node!r} (op {op}): {reason}")
        self.op = op
        self.node = node


class CompilerNotFoundError(SmeltError, RuntimeError):
    """No C compiler is available to build the generated code."""


class CompileError(SmeltError, RuntimeError):
    """The C compiler rejected generated code (a smelt bug: please report it)."""


class VerifyError(SmeltError, AssertionError):
    """The IR verifier found an inconsistent graph after a pass (a smelt bug)."""


class ConfigError(SmeltError, ValueError):
    """An environment variable (SMELT_*) has a value smelt cannot use; the message names the
    variable, the value given and what is allowed."""
