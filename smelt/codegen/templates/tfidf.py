"""TfIdfVectorizer over integer tokens: n-gram counts (with skips) weighted TF, IDF or TFIDF.

Template ``tfidf``: the pool of n-grams (``pool_int64s`` cut by ``ngram_counts``) becomes, at
compile time, a trie flattened into tables: per trie node its children's keys (sorted, found
by binary search), their node numbers, and the output column of the n-gram ending there (-1
when none). The trie is built the way onnxruntime's (and onnx.reference's port of it) builds
its map: only the gram sizes within [min_gram_length, max_gram_length] enter it, and the ids
of skipped sizes still advance the numbering (a pool listing an n-gram twice, which
onnxruntime refuses, keeps the later id, as onnx.reference does).

At run time each row of X (rows split over threads) is scanned as onnxruntime scans it: for
each skip distance 1 .. max_skip_count + 1 and each start, walk the trie along tokens
``skip`` apart, counting every n-gram of at least the starting size met on the way; unigrams
count at the first skip distance only. Each hit updates its n-gram's output column as
onnxruntime 1.32 does: TF adds 1, TFIDF adds the n-gram's weight (``weights`` is per n-gram,
as long as ``ngram_indexes``; 1 without weights), IDF sets the column to the n-gram's weight
(or 1), so where n-grams share a column the last one hit wins. Sums are float sums in
onnxruntime's scan order. (onnx.reference weights columns instead, and scales counts after
counting: the two differ where weights are given.) String pools fall back.
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.loops import dtype_name, emit_kernel, work_range
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.ir.types import c_type

MODES = ("TF", "IDF", "TFIDF")
# tokens scanned (row length times skip distances) from which rows are split over threads
PARALLEL_MIN_TOKENS = 1 << 14


class _Part:
    """A trie node: the n-gram id ending here (0: none) and the children by token."""

    def __init__(self) -> None:
        self.id = 0
        self.leaves: dict[int, _Part] | None = None


def _trie(node: Node) -> _Part:
    """onnxruntime's n-gram map, from the node's attributes."""
    pool = [int(v) for v in node.attr("pool_int64s") or []]
    counts = [int(v) for v in node.attr("ngram_counts") or []]
    lo, hi = int(node.attr("min_gram_length")), int(node.attr("max_gram_length"))
    root = _Part()
    root.leaves = {}
    ngram_id, size = 1, 1
    for i, start in enumerate(counts):
        end = counts[i + 1] if i + 1 < len(counts) else len(pool)
        n_grams = max(0, end - start) // size
        if n_grams and lo <= size <= hi:
            idx = start
            for _ in range(n_grams):
                level = root.leaves
                for n in range(1, size + 1):
                    if idx >= len(pool):
                        break
                    part = level.setdefault(pool[idx], _Part())
                    idx += 1
                    if n == size:
                        part.id, ngram_id = ngram_id, ngram_id + 1
                        break
                    if part.leaves is None:
                        part.leaves = {}
                    level = part.leaves
        elif n_grams:
            ngram_id += n_grams
        size += 1
    return root


def _tables(root: _Part, indexes: list[int], weights: list[float]) -> tuple[np.ndarray, ...]:
    """The trie as arrays: per node its first child slot and child count, per child slot its
    key and node number, per node the output column of its n-gram (-1: none) and the weight
    a hit adds (``weights`` per n-gram id, else 1)."""
    nodes = [root]
    first, count, keys, child, column, weight = [], [], [], [], [], []
    k = 0
    while k < len(nodes):
        part = nodes[k]
        column.append(indexes[part.id - 1] if part.id > 0 else -1)
        weight.append(weights[part.id - 1] if part.id > 0 and weights else 1.0)
        leaves = sorted((part.leaves or {}).items())
        first.append(len(keys))
        count.append(len(leaves))
        for key, sub in leaves:
            keys.append(key)
            child.append(len(nodes))
            nodes.append(sub)
        k += 1
    as64 = lambda a: np.asarray(a, dtype=np.int64)  # noqa: E731
    return (as64(first), as64(count), as64(keys or [0]), as64(child or [0]), as64(column),
            np.asarray(weight, dtype=np.float32))


def _check(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    if dtype_name(g, x) not in ("int32", "int64"):
        return f"TfIdfVectorizer of {dtype_name(g, x)} tokens (native: int32/int64; strings fall back)"
    if dtype_name(g, y) != "float32":
        return "TfIdfVectorizer output must be float32"
    if node.attr("pool_strings"):
        return "string pool"
    if str(node.attr("mode", "")) not in MODES:
        return f"mode {node.attr('mode')!r}"
    shape = [int(d) for d in g.values[x].shape]
    if len(shape) > 2 or (len(shape) == 2 and shape[0] == 0):
        return f"input of shape {shape} (native: [C] or [B, C] with B > 0)"
    indexes = [int(v) for v in node.attr("ngram_indexes") or []]
    lo, hi = node.attr("min_gram_length"), node.attr("max_gram_length")
    if not indexes or min(indexes) < 0 or lo is None or hi is None or not 1 <= int(lo) <= int(hi):
        return "ngram_indexes, min_gram_length <= max_gram_length needed"
    if int(node.attr("max_skip_count", 0)) < 0:
        return "negative max_skip_count"
    width = max(indexes) + 1
    weights = node.attr("weights") or []
    if weights and len(weights) != len(indexes):
        return f"{len(weights)} weights for {len(indexes)} n-grams (onnxruntime refuses the model)"
    ids = []

    def walk(part: _Part) -> None:
        ids.append(part.id)
        for sub in (part.leaves or {}).values():
            walk(sub)
    walk(_trie(node))
    if max(ids) > len(indexes):
        return f"n-gram id {max(ids)} beyond the {len(indexes)} ngram_indexes"
    if [int(d) for d in g.values[y].shape] != shape[:-1] + [width]:
        return "output shape"
    return None


@register("TfIdfVectorizer", versions=(9,), check=_check, name="tfidf")
def emit_tfidf(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    shape = [int(d) for d in g.values[x].shape]
    rows, length = (shape[0], shape[1]) if len(shape) == 2 else (1, shape[0] if shape else 1)
    indexes = [int(v) for v in node.attr("ngram_indexes")]
    width = max(indexes) + 1
    lo, hi = int(node.attr("min_gram_length")), int(node.attr("max_gram_length"))
    skips = int(node.attr("max_skip_count", 0)) + 1
    mode = str(node.attr("mode"))
    weights = [float(w) for w in node.attr("weights") or []] if mode != "TF" else []
    first, count, keys, child, column, weight = _tables(_trie(node), indexes, weights)
    xt = c_type(dtype_name(g, x))
    lines = [
        f"const {xt} *restrict X = {em.ptr(x)};", f"float *restrict Y = (void *){em.ptr(y)};",
        f"const int64_t *restrict F = {em.weight(first)}, *restrict N = {em.weight(count)};",
        f"const int64_t *restrict K = {em.weight(keys)}, *restrict CH = {em.weight(child)};",
        f"const int64_t *restrict COL = {em.weight(column)}; const float *restrict WT = {em.weight(weight)};",
    ]
    # IDF: the weight of the last n-gram hit in the column; TF, TFIDF: the hits' weights summed in
    # scan order (onnxruntime's float sums)
    hit = "yr[COL[node]] = WT[node];" if mode == "IDF" else "yr[COL[node]] += WT[node];"
    lines += [
        work_range(rows, rows * length * skips >= PARALLEL_MIN_TOKENS),
        "for (long r = wb; r < we; ++r) {",
        f"    const {xt} *restrict xr = X + r * {length}L; float *restrict yr = Y + r * {width}L;",
        f"    for (long i = 0; i < {width}; ++i) yr[i] = 0.0f;",
        f"    long start_size = {lo};",
        f"    for (long skip = 1; skip <= {skips}; ++skip) {{",
        f"        for (long s = 0; s < {length}; ++s) {{",
        f"            if (s + skip * (start_size - 1) >= {length}) break;  /* no n-gram fits */",
        "            long node = 0, item = s;",
        f"            for (long size = 1; N[node] > 0 && size <= {hi} && item < {length}; ++size, item += skip) {{",
        "                const int64_t v = (int64_t)xr[item];",
        "                long a = F[node], b = F[node] + N[node];  /* binary search of the children */",
        "                while (a < b) { const long m = (a + b) >> 1; if (K[m] < v) a = m + 1; else b = m; }",
        "                if (a == F[node] + N[node] || K[a] != v) break;",
        "                node = CH[a];",
        f"                if (size >= start_size && COL[node] >= 0) {hit}",
        "            }",
        "        }",
        # unigrams do not depend on the skip distance: counted once
        "        if (start_size == 1) { start_size = 2; if (start_size > " + str(hi) + ") break; }",
        "    }",
    ]
    lines.append("}")
    emit_kernel(em, f"tfidf_{mode.lower()}", "\n".join(lines),
                f"TfIdfVectorizer {mode} of {rows}x{length} tokens, grams {lo}..{hi}, {skips - 1} skips, "
                f"{len(first)} trie nodes")
