"""Pass: a tree classifier with string labels computes label indices natively, then looks them up.

What: a TreeEnsembleClassifier with ``classlabels_strings`` becomes the same classifier with
``classlabels_int64s`` = 0 .. n-1 writing ``<label>__index``, and a Gather of the label strings
(a constant) at those indices writes the original label output.

Why: native code does not write strings, so the whole ensemble (a forest of thousands of trees)
ran on the onnx.reference fallback for the sake of its last step. onnxruntime itself computes
the label as an index and maps it to the string at the end (with two classes its index rule
gives 0 or 1, which the lookup maps as it does). Only the Gather, a few strings per row, stays on
the fallback.

Needs: shapes inferred (the classifier's input typed and static). Guarantees: the label output
keeps its name, shape and string type; the scores output is untouched.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from smelt.ir.graph import Graph, Node, Value

ML = "ai.onnx.ml"


def index_string_labels(g: Graph) -> Graph:
    out: list[Node] = []
    for n in g.nodes:
        out.append(n)
        strings = n.attr("classlabels_strings") if n.domain == ML and n.op == "TreeEnsembleClassifier" else None
        label = n.outputs[0] if n.outputs else ""
        if strings is None or not label or g.values[label].shape is None:
            continue
        labels = list(strings)  # decoded by onnx_import.attribute_value
        index = g.fresh_name(f"{label}__index")
        g.add_value(Value(index, np.dtype(np.int64), g.values[label].shape))
        table = g.add_const(np.array(labels, dtype=object), f"{n.name}/labels")
        ints = list(range(len(labels)))
        n.attrs = {k: v for k, v in n.attrs.items() if k != "classlabels_strings"} | {"classlabels_int64s": ints}
        n.attr_protos = [a for a in n.attr_protos if a.name != "classlabels_strings"] + \
            [helper.make_attribute("classlabels_int64s", ints)]
        n.outputs = [index, *n.outputs[1:]]
        out.append(Node("Gather", g.fresh_name(f"{n.name}/label_lookup"), [table, index], [label], {"axis": 0},
                        "", [helper.make_attribute("axis", 0)]))
    g.nodes = out
    return g
