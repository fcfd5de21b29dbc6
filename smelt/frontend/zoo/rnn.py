"""Recurrent models for the zoo: ONNX ``LSTM`` / ``GRU`` ops, stacked and bidirectional.

These mirror how sequence models reach an inference runtime after export:
one fused recurrent op per layer with W/R/B initializers, layout 0
(time-major, ``x`` is [T, B, E]), no ``sequence_lens`` and zero initial state
unless asked.  Layer outputs Y [T, num_dir, B, H] are turned back into a
[T, B, num_dir*H] sequence for the next layer with the Transpose + Reshape
(or Squeeze) pattern exporters emit, because that glue is exactly what a
compiler has to see through to fuse layers.

:func:`deepcpu_table1` lists the LSTM shapes of DeepCPU's Table 1 (Zhang et
al., USENIX ATC'18), the standard small-batch RNN serving benchmark.
"""

from __future__ import annotations

import onnx

from .builder import Dim, ModelBuilder

CELLS = ("lstm", "gru")


def _merge_directions(b: ModelBuilder, y: str, num_dir: int) -> str:
    """Y [T, D, B, H] -> [T, B, D*H], the input layout the next layer expects."""
    if num_dir == 1:
        return b.squeeze(y, [1], name="squeeze")
    y = b.transpose(y, [0, 2, 1, 3], name="transpose")
    return b.reshape(y, [0, 0, -1], name="reshape")


def lstm_model(
    E: int,
    H: int,
    B: Dim,
    T: Dim,
    layers: int = 1,
    bidirectional: bool = False,
    cell: str = "lstm",
    seed: int = 0,
    initial_states: bool = False,
) -> onnx.ModelProto:
    """A (stacked, optionally bidirectional) LSTM or GRU over ``x`` [T, B, E].

    Outputs ``y`` [T, B, D*H] (the last layer's sequence, directions merged)
    and ``y_h`` [D, B, H] (the last layer's final hidden state).  ``B`` and
    ``T`` may be strings for symbolic dims.  With ``initial_states`` each
    layer ``i`` gets graph inputs ``h0_<i>`` (and ``c0_<i>`` for LSTM) of
    shape [D, B, H]; otherwise initial states are zero as ONNX specifies.
    GRUs use ``linear_before_reset=1`` (the PyTorch/cuDNN formulation).
    """
    if cell not in CELLS:
        raise ValueError(f"cell must be one of {CELLS}, got {cell!r}")
    if layers < 1:
        raise ValueError("layers must be >= 1")
    nd = 2 if bidirectional else 1
    direction = "bidirectional" if bidirectional else "forward"
    b = ModelBuilder(seed)
    x = b.input("x", [T, B, E])
    y_h = ""
    for i in range(layers):
        h0 = b.input(f"h0_{i}", [nd, B, H]) if initial_states else None
        c0 = b.input(f"c0_{i}", [nd, B, H]) if initial_states and cell == "lstm" else None
        with b.scope(f"layer{i}"):
            if cell == "lstm":
                y, y_h, _ = b.lstm(x, H, direction, initial_h=h0, initial_c=c0, name="lstm")
            else:
                y, y_h = b.gru(x, H, direction, initial_h=h0, name="gru")
            x = _merge_directions(b, y, nd)
    b.output(x, "y")
    b.output(y_h, "y_h")
    tag = (
        f"{cell}-E{E}-H{H}-B{B}-T{T}"
        + (f"-L{layers}" if layers > 1 else "")
        + ("-bi" if bidirectional else "")
    )
    return b.build(tag.replace("-", "_"), doc=f"smelt zoo {tag}")


def deepcpu_table1() -> list[tuple[int, int, int, int]]:
    """The 15 (E, H, B, T) LSTM configurations of DeepCPU's Table 1.

    E = input size, H = hidden size, B = batch, T = sequence length.  They
    sweep E and H at batch 1, T at fixed size, and batch at T=100, i.e. the
    latency-bound serving regime a CPU RNN runtime is judged on.
    """
    return [
        (64, 64, 1, 100),
        (256, 64, 1, 100),
        (1024, 64, 1, 100),
        (64, 256, 1, 100),
        (64, 1024, 1, 100),
        (1024, 1024, 1, 100),
        (256, 256, 1, 1),
        (256, 256, 1, 10),
        (256, 256, 1, 100),
        (64, 64, 10, 100),
        (64, 64, 20, 100),
        (256, 256, 10, 100),
        (256, 256, 20, 100),
        (1024, 1024, 10, 100),
        (1024, 1024, 20, 100),
    ]
