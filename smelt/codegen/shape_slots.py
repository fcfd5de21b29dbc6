"""One library per code structure: shape-dependent numbers of generated C read at run time.

A model with symbolic input dimensions (an OCR line's width, an image's size, a batch) used to
compile with gcc once per input shape. Most of what a new shape changes in the generated C is
numbers: loop bounds, strides, buffer offsets, work splits. This module compares the C that
smelt renders for two shapes token by token. When the two differ only in number literals (the
*structure* is the same), the numbers that differ become **slots**: the library is compiled once
from the reference render with each slot replaced by a read of ``smelt_si[k]`` (integers) or
``smelt_sf[k]`` (floating point), and every later shape of the same structure only renders its C
in Python (no compiler), checks that its structure and every non-slot number equal the
reference's, and hands the library its slot values (``smelt_set_slots``) when it is loaded.

Soundness does not rest on guessing which numbers vary: a shape is served by a slotted library
only when its own render, with its own slot values substituted, is the reference text token for
token (function names carrying a digest of their body are compared by position). A shape whose
render differs anywhere else gets its own library (with the differing numbers added as slots
when the structure is still the same).

Limits: a slot inside a C constant expression (an array size, a ``case`` label, an intrinsic's
immediate) does not compile; the caller then builds the shape as before. Floating-point slots
are parsed from the literal's text to double and, for an ``f`` literal, rounded to float at
run time (the compiler rounds the text directly to float; the two can differ only for a decimal
within half a double ulp of a float rounding boundary, which printed float32 values never are).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

# comments first (skipped), then strings, char literals and preprocessor lines (compared
# verbatim: a number there is not a slot), identifiers (numbers inside names are part of the
# name), numbers, and any other character
_TOKEN = re.compile(
    r"(?P<skip>//[^\n]*|/\*.*?\*/)"
    r"|(?P<verbatim>\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'|^[ \t]*#[^\n]*)"
    r"|(?P<name>[A-Za-z_]\w*)"
    r"|(?P<num>0[xX][0-9a-fA-F]+[uUlL]*|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?[fFuUlL]*)"
    r"|(?P<other>\S)",
    re.S | re.M,
)
# a kernel function's name ends in a digest of its body (``BlockEmitter.function``)
_DIGEST = re.compile(r"_[0-9a-f]{10}$")


@dataclass(frozen=True)
class Rendered:
    """One render's C cut into tokens: the structure (numbers and digests blanked), the number
    literals in order, and each number's span in the text."""

    text: str
    structure: tuple[str, ...]
    numbers: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]

    @property
    def structure_digest(self) -> str:
        return hashlib.sha256("\x00".join(self.structure).encode()).hexdigest()


def tokenize(text: str) -> Rendered:
    structure: list[str] = []
    numbers: list[str] = []
    spans: list[tuple[int, int]] = []
    digests: dict[str, str] = {}
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        if kind == "skip":
            continue
        tok = m.group()
        if kind == "num":
            structure.append("#")
            numbers.append(tok)
            spans.append(m.span())
        elif kind == "name" and _DIGEST.search(tok):
            structure.append(digests.setdefault(tok, f"{tok[:-11]}_<{len(digests)}>"))
        else:
            structure.append(tok)
    return Rendered(text, tuple(structure), tuple(numbers), tuple(spans))


def _is_float(literal: str) -> bool:
    low = literal.lower()
    return not low.startswith("0x") and ("." in low or "e" in low or low.endswith("f"))


def _value(literal: str) -> int | float:
    low = literal.lower()
    if _is_float(literal):
        return float(low.rstrip("fl"))
    return int(low.rstrip("ul"), 0)


@dataclass(frozen=True)
class SlotMap:
    """Which number literals of a structure are read at run time, and the slotted source."""

    structure_digest: str
    slots: tuple[int, ...]  # indices into the render's number literals, ascending
    fixed: tuple[str, ...]  # every number literal of the reference render (slot ones included)
    source: str  # the reference render with slots substituted, plus ``smelt_set_slots``

    def values(self, r: Rendered) -> tuple[list[int], list[float]] | None:
        """The slot values for render ``r``, or None when it is not this structure or a
        non-slot number differs (then this library cannot run that shape)."""
        if r.structure_digest != self.structure_digest or len(r.numbers) != len(self.fixed):
            return None
        slot_set = set(self.slots)
        for i, (a, b) in enumerate(zip(self.fixed, r.numbers, strict=True)):
            if a != b and i not in slot_set:
                return None
        ints: list[int] = []
        floats: list[float] = []
        for i in self.slots:
            lit = r.numbers[i]
            if _is_float(self.fixed[i]) != _is_float(lit):
                return None
            (floats if _is_float(lit) else ints).append(_value(lit))
        return ints, floats

    def differing(self, r: Rendered) -> tuple[int, ...] | None:
        """Indices of non-slot numbers where ``r`` differs (None: another structure)."""
        if r.structure_digest != self.structure_digest or len(r.numbers) != len(self.fixed):
            return None
        return tuple(i for i, (a, b) in enumerate(zip(self.fixed, r.numbers, strict=True))
                     if a != b and i not in set(self.slots))


def first_difference(a: Rendered, b: Rendered) -> str:
    """Where two renders' structures part (for the reason a model keeps per-shape builds)."""
    for i, (x, y) in enumerate(zip(a.structure, b.structure, strict=False)):
        if x != y:
            lo = max(0, i - 12)
            return f"{' '.join(a.structure[lo:i + 6])!r} against {' '.join(b.structure[lo:i + 6])!r}"
    return f"one render is longer ({len(a.structure)} against {len(b.structure)} tokens)"


def slot_map(reference: Rendered, others: list[Rendered], extra: tuple[int, ...] = ()) -> SlotMap | None:
    """The slot map of ``reference``'s structure learnt from ``others`` (renders of other shapes;
    None when one has another structure), plus ``extra`` slots."""
    slots = set(extra)
    for r in others:
        if r.structure != reference.structure:
            return None
        slots.update(i for i, (a, b) in enumerate(zip(reference.numbers, r.numbers, strict=True)) if a != b)
    order = sorted(slots)
    return SlotMap(reference.structure_digest, tuple(order), reference.numbers, _slotted_source(reference, order))


def _slotted_source(r: Rendered, slots: list[int]) -> str:
    parts: list[str] = []
    pos = 0
    n_int = n_float = 0
    for i in slots:
        lo, hi = r.spans[i]
        lit = r.numbers[i]
        parts.append(r.text[pos:lo])
        if _is_float(lit):
            kind = "float" if lit.lower().endswith("f") else "double"
            parts.append(f"(({kind})smelt_sf[{n_float}])")
            n_float += 1
        else:
            kind = "unsigned long" if "u" in lit.lower() else "long"
            parts.append(f"(({kind})smelt_si[{n_int}])")
            n_int += 1
        pos = hi
    parts.append(r.text[pos:])
    body, fills = _runtime_tables("".join(parts))
    head = ("/* shape slots (smelt/codegen/shape_slots.py): this library serves every input shape whose\n"
            " * generated C differs from this text only in the numbers read from smelt_si / smelt_sf;\n"
            " * numbers in comments are those of the shape it was first rendered for. */\n"
            f"static long smelt_si[{max(1, n_int)}];\nstatic double smelt_sf[{max(1, n_float)}];\n")
    setter = ("\nSMELT_EXPORT void smelt_set_slots(const long *si, const double *sf) {\n"
              f"    for (int k = 0; k < {n_int}; ++k) smelt_si[k] = si[k];\n"
              f"    for (int k = 0; k < {n_float}; ++k) smelt_sf[k] = sf[k];\n" + "".join(fills) + "}\n")
    return head + body + setter


# a file-scope constant table (the blocks' buffer-reference tables, emit.py): one holding a slot
# cannot be a static initializer, so it becomes a plain array that ``smelt_set_slots`` fills
# from an automatic array (whose initializer may read the slots)
_TABLE = re.compile(r"^static const (\w+) (\w+)\[(\d+)\] = \{\n(.*?)\n\};$", re.S | re.M)


def _runtime_tables(text: str) -> tuple[str, list[str]]:
    fills: list[str] = []

    def swap(m: re.Match) -> str:
        ctype, name, n, init = m.groups()
        if "smelt_si[" not in init and "smelt_sf[" not in init:
            return m.group()
        fills.append(f"    {{ const {ctype} init[{n}] = {{\n{init}\n    }};\n"
                     f"      for (unsigned i = 0; i < {n}u; ++i) {name}[i] = init[i]; }}\n")
        return f"static {ctype} {name}[{n}]; /* filled by smelt_set_slots */"

    text = _TABLE.sub(swap, text)
    # a function's own constant table holding a slot: an automatic array (built per call; such
    # tables are a kernel's few edge offsets)
    text = _LOCAL_TABLE.sub(lambda m: m.group().replace("static const ", "const ", 1)
                            if "smelt_si[" in m.group() or "smelt_sf[" in m.group() else m.group(), text)
    return text, fills


_LOCAL_TABLE = re.compile(r"(?<=[{;\n])[ \t]*static const \w+ \w+\[\d+\] = \{[^;{}]*\};")
