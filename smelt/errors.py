"""Exceptions smelt raises. Every message names what is wrong: the file, node, op or input."""

from __future__ import annotations


class SmeltError(Exception):
    """Base class of smelt's errors."""


class ModelLoadError(SmeltError, ValueError):
    """The model file or bytes could not be read as an ONNX model."""


class InvalidModelError(SmeltError, ValueError):
    """The model breaks the ONNX specification or asks a kernel for something undefined (a value
    produced twice, a declared shape that disagrees with the inferred one, a stride of 0, ...).
    The message names the node, its op, the attribute or value, what is allowed and what was
    given; ``node``, ``op`` and ``attribute`` carry the same for programs (None when n/a)."""

    def __init__(self, message: str, *, node: str | None = None, op: str | None = None,
                 attribute: str | None = None) -> None:
        where = f"node {node!r} (op {op}): " if node is not None else ""
        super().__init__(f"invalid model: {where}{message}")
        self.node = node
        self.op = op
        self.attribute = attribute


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


class ArtifactError(SmeltError, ValueError):
    """A compiled artifact's plan.json cannot be read or does not fit the schema this smelt
    reads (``smelt.runtime.artifact``). ``path`` is the file, ``field`` the offending field
    (e.g. ``steps[2].step_info[0].flops``; None when the file as a whole is unreadable)."""

    def __init__(self, path: object, field: str | None, message: str) -> None:
        where = f", field {field}" if field else ""
        super().__init__(f"compiled artifact {path}{where}: {message}")
        self.path = path
        self.field = field
