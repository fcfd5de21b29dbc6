"""Shared pieces of the reports `smelt bench` and `smelt profile` print and write.

Aligned text and markdown tables, JSON without NaN or infinity, and matplotlib in file-only mode.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def fmt_opt(value: float | None, spec: str, none: str = "-") -> str:
    """``format(value, spec)``, or ``none`` for a missing value."""
    return none if value is None else format(value, spec)


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int] = frozenset(),
               markdown: bool = False) -> str:
    """Columns padded to their widest cell; the columns in ``right`` are right-aligned (numbers)."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |",
                 "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


def json_safe(x: Any) -> Any:
    """``x`` with numpy scalars made Python numbers and non-finite floats made None (JSON has
    neither NaN nor infinity)."""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def pyplot():
    """matplotlib.pyplot with the Agg backend (files only, no display); a clear error without it."""
    from smelt.errors import SmeltError

    try:
        import matplotlib
    except ImportError as exc:
        raise SmeltError("charts need matplotlib: pip install matplotlib") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # text stays text in SVG output: small, searchable
    return plt
