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

import numpy as np
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


# --------------------------------------------------------------------------------------------
# models from the papers
# --------------------------------------------------------------------------------------------
def text_similarity_model(B: Dim = 1, T: Dim = 20, E: int = 200, H: int = 512, seed: int = 0) -> onnx.ModelProto:
    """DeepCPU's text similarity model (Table 2: input 200, hidden 512, lengths 20, batch 1).

    Two bidirectional GRU encoders, one for the query ``q`` [T, 1, E] and one for the documents
    ``d`` [T, B, E] (Table 4 ranks B documents per query); each text's encoding is its final
    hidden state, both directions concatenated ([B, 2H]); the output ``sim`` [B] is the cosine
    similarity of every document with the query (the part DeepCPU's Table 4 times as "cosine
    similarity"). GRUs use linear_before_reset=1 (cuDNN's formulation).
    """
    b = ModelBuilder(seed)
    q = b.input("q", [T, 1, E])
    d = b.input("d", [T, B, E])
    enc = []
    for name, x in (("query", q), ("doc", d)):
        with b.scope(name):
            _, y_h = b.gru(x, H, "bidirectional", name="gru")
            # [2, B, H] -> [B, 2H]
            t = b.transpose(y_h, [1, 0, 2], name="transpose")
            enc.append(b.reshape(t, [0, -1], name="reshape"))
    qv, dv = enc
    dot = b.op("ReduceSum", [b.op("Mul", [dv, qv], name="qd"), b.const(np.array([1], np.int64), np.int64)],
               {"keepdims": 0}, name="dot")
    nq = b.op("ReduceL2", [qv], {"axes": [1], "keepdims": 0}, name="norm_q")
    nd = b.op("ReduceL2", [dv], {"axes": [1], "keepdims": 0}, name="norm_d")
    den = b.op("Max", [b.op("Mul", [nq, nd], name="norms"), b.const(np.array(1e-8, np.float32))], name="den")
    b.output(b.op("Div", [dot, den], name="cosine"), "sim")
    return b.build("text_similarity", doc=f"smelt zoo text-similarity: DeepCPU TS, bi-GRU E={E} H={H} T={T}")


def bidaf_lstms_model(seed: int = 0) -> onnx.ModelProto:
    """BiDAF's three LSTM layers with DeepCPU's Table 2 sizes (batch 1).

    * phrase embedding: one bidirectional LSTM (input 50, hidden 100) shared by the question
      ``question`` [15, 1, 50] and the context ``context`` [100, 1, 50] (same weights);
    * modeling layer: a stacked (2-layer) bidirectional LSTM over the attention output
      ``g`` [100, 1, 800];
    * output layer: a bidirectional LSTM over ``gm`` [100, 1, 1400] (G and M concatenated).

    The attention layer between them is not recurrent, so its results are inputs here; outputs
    are every layer's sequence ([T, 1, 200]).
    """
    b = ModelBuilder(seed)
    question = b.input("question", [15, 1, 50])
    context = b.input("context", [100, 1, 50])
    g = b.input("g", [100, 1, 800])
    gm = b.input("gm", [100, 1, 1400])
    with b.scope("phrase"):
        yq, _, _ = b.lstm(question, 100, "bidirectional", name="lstm")
        node = b._nodes[-1]
        # the context reuses the question's weights, as BiDAF's shared contextual embedding
        yc = b.op("LSTM", [context, *node.input[1:4]], {"hidden_size": 100, "direction": "bidirectional"},
                  n_outputs=1, name="lstm_context", out_shapes=[(100, 2, 1, 100)])
        b.output(_merge_directions(b, yq, 2), "question_enc")
        b.output(_merge_directions(b, yc, 2), "context_enc")
    x = g
    for i in range(2):
        with b.scope(f"modeling{i}"):
            y, _, _ = b.lstm(x, 100, "bidirectional", name="lstm")
            x = _merge_directions(b, y, 2)
    b.output(x, "modeling")
    with b.scope("output"):
        y, _, _ = b.lstm(gm, 100, "bidirectional", name="lstm")
        b.output(_merge_directions(b, y, 2), "output")
    return b.build("bidaf_lstms", doc="smelt zoo bidaf-lstms: BiDAF's phrase, modeling and output LSTM layers")


def modelcompiler_fig4a() -> list[str]:
    """ModelCompiler's Fig. 4(a) workloads: stacked LSTMs of 1 to 8 layers, input and hidden 128,
    sequence length 17, batch 1, as zoo names."""
    return [f"lstm-E128-H128-B1-T17-L{n}" if n > 1 else "lstm-E128-H128-B1-T17" for n in range(1, 9)]
