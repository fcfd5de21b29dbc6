"""Dynamic axes: the output shapes in terms of the run-time T and B."""

from __future__ import annotations

from smelt.codegen.kernels.rnn_config import (
    RnnConfig,
)


# --------------------------------------------------------------------------------------------
# dynamic axes, schedules, partitioning model
# --------------------------------------------------------------------------------------------
def _dyn_output_shapes(cfg: RnnConfig) -> dict[str, list]:
    """Output shapes with "T" / "B" where the run-time sizes go (for the runtime's allocation)."""
    D, H = cfg.D, cfg.H
    out: dict[str, list] = {}
    if cfg.y:
        out[cfg.y] = ["T", D, "B", H] if cfg.layout == 0 else ["B", "T", D, H]
    for name in (cfg.yh, cfg.yc):
        if name:
            out[name] = [D, "B", H] if cfg.layout == 0 else ["B", D, H]
    return out
