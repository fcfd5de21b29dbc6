"""Pass: an embedding lookup through Unique becomes the plain lookup.

What: ``Unique(ids) -> Gather(table, unique values) -> Gather(rows, inverse indices)`` (both Gathers
on axis 0, Unique without ``axis``) becomes ``Gather(table, ids)``, of ids flattened to 1-D (the
inverse indices are of the flattened ids). The Unique and the first Gather stay for any other
reader and are removed as dead otherwise.

Why: tf2onnx writes TensorFlow's ``embedding_lookup_unique`` of one table so. Unique's output
length depends on the data, so nothing after it has a static shape and all of it runs on the
onnx.reference fallback. The two are the same: row i of the result is
``rows[inverse[i]] = table[unique[inverse[i]]] = table[ids_flat[i]]``, exactly. (The Universal
Sentence Encoder in chatmemorydb-lmdb-onnx shards its table 17 ways: the unique ids are split by
``mod`` with Compress per shard and stitched back, a form this pass does not take; its 501
fallback nodes stay.)

Needs: nothing (runs before folding, on the imported graph). Guarantees: the second Gather's
output keeps its name; values and dtypes are unchanged.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from smelt.ir.graph import Graph, Node, Value


def gather_through_unique(g: Graph) -> Graph:
    if not any(n.op == "Unique" for n in g.nodes):
        return g  # (most models: no producer map built)
    producer = {o: n for n in g.nodes for o in n.outputs if o}
    out: list[Node] = []
    for n in g.nodes:
        source = _lookup_source(n, producer)
        if source is None:
            out.append(n)
            continue
        ids, table = source
        flat = ids
        if g.values[ids].shape is None or len(g.values[ids].shape) != 1:
            flat = g.fresh_name(f"{ids}__flat")
            g.add_value(Value(flat, g.values[ids].dtype, None))
            minus_one = g.add_const(np.array([-1], np.int64), f"{n.name}/flat_shape")
            out.append(Node("Reshape", g.fresh_name(f"{n.name}/flatten_ids"), [ids, minus_one], [flat], {}, "", []))
        out.append(Node("Gather", n.name, [table, flat], list(n.outputs), {"axis": 0}, "",
                        [helper.make_attribute("axis", 0)]))
    g.nodes = out
    return g


def _lookup_source(n: Node, producer: dict[str, Node]) -> tuple[str, str] | None:
    """(ids, table) when ``n`` is the second Gather of the pattern, else None."""
    if n.op != "Gather" or n.domain or int(n.attr("axis", 0)) != 0 or len(n.inputs) != 2:
        return None
    rows, inverse = producer.get(n.inputs[0]), producer.get(n.inputs[1])
    if rows is None or inverse is None or rows.op != "Gather" or rows.domain or int(rows.attr("axis", 0)) != 0:
        return None
    if inverse.op != "Unique" or inverse.domain or inverse.attr("axis") is not None:
        return None
    outs = list(inverse.outputs) + [""] * 4
    if not outs[0] or outs[2] != n.inputs[1] or rows.inputs[1] != outs[0]:
        return None
    return inverse.inputs[0], rows.inputs[0]
