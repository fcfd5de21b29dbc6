"""ai.onnx.ml ops with a tensor-only form: ArrayFeatureExtractor, TreeEnsemble.

Template ``array_feature_extractor``: Z = X[..., Y], the last axis gathered at the indices of
``Y`` (any shape, read flat), as onnxruntime does it: a 1-D X gives Z of shape [1, len(Y)],
an index outside [0, X.shape[-1]) makes the inference fail (SMELT_FAIL; onnxruntime refuses it,
negative indices included). Rows split over threads; every share checks all the indices before
it writes a row, so a bad index leaves no partial result. (A 1-D X reaches the template only
typed: onnx's shape inference leaves its output untyped, so it stays on the fallback.)

Template ``tree_ensemble`` (TreeEnsemble-5, float32/float64): the trees become tables at
compile time (per node its feature, mode, split, NaN direction and the two successors, a leaf
coded as -1 - its index; per leaf its target and weight; the membership sets as ranges of one
table, read NaN-separated in node order as onnxruntime reads them), checked finite and in range.
Each row walks every tree in order (rows split over threads) and folds the leaves' weights into
its targets as onnxruntime does: SUM and AVERAGE add in tree order (AVERAGE divides by the tree
count at the end), MIN and MAX keep the first hit then fold, and a target no tree hits stays 0.
The comparisons are C's, so a NaN feature is false for every mode but NEQ, unless its node
sends missing values the true way. Only post_transform NONE is native (onnxruntime 1.32 reads
the others' codes differently from the ONNX spec).
"""

from __future__ import annotations

import numpy as np

from smelt.codegen.emitter import BlockEmitter
from smelt.codegen.kernels.broadcast import PARALLEL_MIN_ELEMS
from smelt.codegen.kernels.loops import dtype_name, emit_kernel, work_range
from smelt.codegen.registry import register
from smelt.ir.graph import Graph, Node
from smelt.ir.types import FLOAT_TYPES, c_type

ML = "ai.onnx.ml"
AFE_TYPES = ("float32", "float64", "int64", "int32")


def _check_afe(node: Node, g: Graph) -> str | None:
    x, y, z = node.inputs[0], node.inputs[1], node.outputs[0]
    if dtype_name(g, x) not in AFE_TYPES or dtype_name(g, z) != dtype_name(g, x):
        return f"ArrayFeatureExtractor of {dtype_name(g, x)} (native: {', '.join(AFE_TYPES)})"
    if dtype_name(g, y) != "int64":
        return "ArrayFeatureExtractor indices must be int64"
    xs = [int(d) for d in g.values[x].shape]
    n = g.values[y].size
    if not xs or not n:
        return "a scalar X or no indices (onnxruntime refuses both)"
    want = [1, n] if len(xs) == 1 else xs[:-1] + [n]
    if [int(d) for d in g.values[z].shape] != want:
        return f"output shape {list(g.values[z].shape)}, expected {want}"
    return None


@register("ArrayFeatureExtractor", check=_check_afe, name="array_feature_extractor", domain=ML)
def emit_array_feature_extractor(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y, z = node.inputs[0], node.inputs[1], node.outputs[0]
    xs = [int(d) for d in g.values[x].shape]
    stride, n = xs[-1], g.values[y].size
    rows = int(np.prod(xs[:-1], dtype=np.int64))
    t = c_type(dtype_name(g, x))
    lines = [
        f"const {t} *restrict X = {em.ptr(x)};", f"const int64_t *restrict I = {em.ptr(y)};",
        f"{t} *restrict Z = (void *){em.ptr(z)};",
        "int bad = 0;",
        f"for (long j = 0; j < {n}; ++j) bad |= (uint64_t)I[j] >= {stride}u;",
        work_range(rows, rows * n >= PARALLEL_MIN_ELEMS),
        "if (bad) { SMELT_FAIL(); we = wb; }  /* reported */",
        "for (long r = wb; r < we; ++r) {",
        f"    const {t} *restrict xr = X + r * {stride}L; {t} *restrict zr = Z + r * {n}L;",
        f"    for (long j = 0; j < {n}; ++j) zr[j] = xr[I[j]];",
        "}",
    ]
    emit_kernel(em, f"array_feature_extractor_{dtype_name(g, x)}", "\n".join(lines),
                f"ArrayFeatureExtractor of {n} of {stride} features, {rows} rows")


# -- TreeEnsemble (ai.onnx.ml 5) ---------------------------------------------------------------

# aggregate_function: AVERAGE, SUM, MIN, MAX
AGGREGATES = (0, 1, 2, 3)
MEMBER = 6
MAX_TREE_DEPTH = 4096


class _Trees:
    """TreeEnsemble's attributes as tables: per node its feature, mode, split, whether a NaN
    goes the true way, its true and false successors (a node index, or -1 - leaf index), its
    range of the membership table; the roots (encoded alike); per leaf its target and weight."""

    def __init__(self, node: Node, dtype: np.dtype) -> None:
        arr = lambda key, dt: np.asarray(node.attr(key) if node.attr(key) is not None else [], dtype=dt)  # noqa: E731
        self.feature = arr("nodes_featureids", np.int64)
        self.mode = arr("nodes_modes", np.int64)
        self.split = arr("nodes_splits", dtype)
        n = len(self.feature)
        miss = node.attr("nodes_missing_value_tracks_true")
        self.missing = np.asarray(miss if miss is not None else [0] * n, dtype=np.uint8)
        self.true_leaf = arr("nodes_trueleafs", np.int64)
        self.false_leaf = arr("nodes_falseleafs", np.int64)
        self.true_id = arr("nodes_truenodeids", np.int64)
        self.false_id = arr("nodes_falsenodeids", np.int64)
        self.target = arr("leaf_targetids", np.int64)
        self.weight = arr("leaf_weights", dtype)
        self.roots_raw = arr("tree_roots", np.int64)
        self.members = arr("membership_values", dtype)
        self.n_targets = int(node.attr("n_targets") or 0)

    def problem(self, features: int) -> str | None:
        n = len(self.feature)
        if not n or not len(self.roots_raw):
            return "no nodes or no trees"
        for name, a in (("modes", self.mode), ("splits", self.split), ("missing_value_tracks_true", self.missing),
                        ("trueleafs", self.true_leaf), ("falseleafs", self.false_leaf),
                        ("truenodeids", self.true_id), ("falsenodeids", self.false_id)):
            if len(a) != n:
                return f"nodes_{name} of {len(a)} entries for {n} nodes"
        if len(self.target) != len(self.weight) or not len(self.target):
            return "leaf_targetids / leaf_weights"
        if self.mode.min() < 0 or self.mode.max() > MEMBER or self.feature.min() < 0 or self.feature.max() >= features:
            return "node mode or feature out of range"
        if self.target.min() < 0 or self.target.max() >= self.n_targets:
            return "leaf target out of range"
        for leaf, ids in ((self.true_leaf, self.true_id), (self.false_leaf, self.false_id)):
            bound = np.where(leaf != 0, len(self.target), n)
            if ids.min() < 0 or np.any(ids >= bound):
                return "successor index out of range"
        if self.roots_raw.min() < 0 or self.roots_raw.max() >= n:
            return "tree root out of range"
        # membership sets, NaN-terminated, in node order (onnxruntime's reading)
        n_member = int(np.sum(self.mode == MEMBER))
        if int(np.sum(np.isnan(self.members))) != n_member:
            return f"{int(np.sum(np.isnan(self.members)))} membership sets for {n_member} BRANCH_MEMBER nodes"
        # every tree finite (no node revisited on a path)
        for r in self.roots():
            stack = [(int(r), 0)]
            while stack:
                cur, depth = stack.pop()
                if cur < 0:
                    continue
                if depth > MAX_TREE_DEPTH:
                    return "a tree deeper than smelt walks (or a cycle)"
                stack += [(int(self.next(cur, True)), depth + 1), (int(self.next(cur, False)), depth + 1)]
        return None

    def next(self, k: int, way: bool) -> int:
        leaf, idx = (self.true_leaf, self.true_id) if way else (self.false_leaf, self.false_id)
        return -1 - int(idx[k]) if leaf[k] else int(idx[k])

    def roots(self) -> list[int]:
        """Root codes; a root whose two ways are the same leaf is that leaf (a one-leaf tree)."""
        out = []
        for r in self.roots_raw:
            r = int(r)
            t, f = self.next(r, True), self.next(r, False)
            out.append(t if t < 0 and t == f else r)
        return out

    def member_ranges(self) -> tuple[np.ndarray, np.ndarray]:
        start, count = np.zeros(len(self.feature), np.int64), np.zeros(len(self.feature), np.int64)
        pos = 0
        for k in np.flatnonzero(self.mode == MEMBER):
            end = pos
            while not np.isnan(self.members[end]):
                end += 1
            start[k], count[k] = pos, end - pos
            pos = end + 1
        return start, count


def _check_tree(node: Node, g: Graph) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    dt = dtype_name(g, x)
    if dt not in FLOAT_TYPES or dtype_name(g, y) != dt:
        return f"TreeEnsemble of {dt} (native: float32, float64)"
    xs = [int(d) for d in g.values[x].shape]
    if len(xs) != 2:
        return "TreeEnsemble X must be [N, F]"
    if int(node.attr("post_transform", 0) or 0) != 0:
        return "post_transform other than NONE"
    if int(node.attr("aggregate_function", 1)) not in AGGREGATES:
        return f"aggregate_function {node.attr('aggregate_function')}"
    trees = _Trees(node, np.dtype(dt))
    why = trees.problem(xs[1])
    if why:
        return why
    if [int(d) for d in g.values[y].shape] != [xs[0], trees.n_targets]:
        return "output shape"
    return None


def _condition(mode: int) -> str:
    """C condition of branch ``mode`` on feature ``x`` and split ``SP[cur]``."""
    if mode == MEMBER:
        return "({ int in_ = 0; for (long q = MS[cur]; q < MS[cur] + MC[cur]; ++q) in_ |= x == MV[q]; in_; })"
    return {0: "x <= SP[cur]", 1: "x < SP[cur]", 2: "x >= SP[cur]", 3: "x > SP[cur]", 4: "x == SP[cur]",
            5: "x != SP[cur]"}[mode]


@register("TreeEnsemble", check=_check_tree, name="tree_ensemble", domain=ML)
def emit_tree_ensemble(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    dt = dtype_name(g, x)
    t = c_type(dt)
    rows, features = (int(d) for d in g.values[x].shape)
    trees = _Trees(node, np.dtype(dt))
    roots = trees.roots()
    nt = trees.n_targets
    agg = int(node.attr("aggregate_function", 1))
    n = len(trees.feature)
    succ_t = np.asarray([trees.next(k, True) for k in range(n)], np.int64)
    succ_f = np.asarray([trees.next(k, False) for k in range(n)], np.int64)
    ms, mc = trees.member_ranges()
    modes = sorted({int(m) for m in trees.mode})
    lines = [
        f"const {t} *restrict X = {em.ptr(x)};", f"{t} *restrict Y = (void *){em.ptr(y)};",
        f"const int64_t *restrict FE = {em.weight(trees.feature)}, *restrict MO = {em.weight(trees.mode)};",
        f"const {t} *restrict SP = {em.weight(trees.split)};",
        f"const uint8_t *restrict MI = {em.weight(trees.missing)};",
        f"const int64_t *restrict TN = {em.weight(succ_t)}, *restrict FN = {em.weight(succ_f)};",
        f"const int64_t *restrict RT = {em.weight(np.asarray(roots, np.int64))};",
        f"const int64_t *restrict LT = {em.weight(trees.target)}; const {t} *restrict LW = {em.weight(trees.weight)};",
    ]
    if MEMBER in modes:
        lines += [f"const int64_t *restrict MS = {em.weight(ms)}, *restrict MC = {em.weight(mc)};",
                  f"const {t} *restrict MV = {em.weight(trees.members if len(trees.members) else np.zeros(1, dt))};"]
    cases = " ".join(f"case {m}: c = {_condition(m)}; break;" for m in modes)
    scratch = em.scratch(em.n_threads * nt, "uint8") if agg in (2, 3) else None
    lines += [work_range(rows, rows * len(roots) >= PARALLEL_MIN_ELEMS // 16),
              *([f"uint8_t *restrict HIT = {scratch} + (long)tid * {nt};"] if scratch else []),
              "for (long r = wb; r < we; ++r) {",
              f"    const {t} *restrict xr = X + r * {features}L; {t} *restrict yr = Y + r * {nt}L;",
              f"    for (long j = 0; j < {nt}; ++j) yr[j] = 0;",
              *([f"    for (long j = 0; j < {nt}; ++j) HIT[j] = 0;"] if scratch else []),
              f"    for (long tr = 0; tr < {len(roots)}; ++tr) {{",
              "        long cur = RT[tr];",
              "        while (cur >= 0) {",
              f"            const {t} x = xr[FE[cur]]; int c = 0;",
              f"            switch (MO[cur]) {{ {cases} }}",
              "            if (x != x && MI[cur]) c = 1;  /* a missing value goes the true way where asked */",
              "            cur = c ? TN[cur] : FN[cur];",
              "        }",
              "        const long leaf = -1 - cur, j = LT[leaf];"]
    if agg in (0, 1):
        lines.append("        yr[j] += LW[leaf];")
    else:  # onnxruntime: the first hit sets, later ones fold; a target never hit stays 0
        better = "<" if agg == 2 else ">"
        lines.append(f"        if (!HIT[j] || LW[leaf] {better} yr[j]) yr[j] = LW[leaf]; HIT[j] = 1;")
    lines.append("    }")
    if agg == 0:
        lines.append(f"    for (long j = 0; j < {nt}; ++j) yr[j] /= ({t}){len(roots)};")
    lines.append("}")
    emit_kernel(em, f"tree_ensemble_{dt}", "\n".join(lines),
                f"TreeEnsemble of {len(roots)} trees, {n} nodes, {len(trees.target)} leaves, {nt} targets, "
                f"aggregate {agg}, {rows} rows")
