"""ai.onnx.ml ops with a tensor-only form: ArrayFeatureExtractor and the tree ensembles.

Template ``array_feature_extractor``: Z = X[..., Y], the last axis gathered at the indices of
``Y`` (any shape, read flat), as onnxruntime does it: a 1-D X gives Z of shape [1, len(Y)],
an index outside [0, X.shape[-1]) makes the inference fail (SMELT_FAIL; onnxruntime refuses it,
negative indices included). Rows split over threads; every share checks all the indices before
it writes a row, so a bad index leaves no partial result. (A 1-D X reaches the template only
typed: onnx's shape inference leaves its output untyped, so it stays on the fallback.)

Templates ``tree_ensemble`` (TreeEnsemble-5, float32/float64) and ``legacy_tree_ensemble``
(TreeEnsembleRegressor / TreeEnsembleClassifier, ml opsets 1-3: skl2onnx's forests, onnxmltools'
LightGBM and XGBoost): both attribute forms become one table form at compile time (``_Trees``:
a packed node struct per branch node, a leaf coded as -1 - its index, per leaf a range of
(target, weight) entries, the membership sets as ranges of one table read NaN-separated in node
order as onnxruntime reads them), checked finite and in range. Rows walk the trees in blocks
(``ROW_BLOCK``: every row of a block walks a tree, interleaved, before the next tree; rows split
over threads), and each row folds its leaves' weights into its targets as onnxruntime does:
SUM and AVERAGE add in tree order (AVERAGE divides by the tree count at the end), MIN and MAX
keep the first hit then fold. The comparisons are C's, so a NaN feature is false for every
mode but NEQ, unless its node sends missing values the true way. TreeEnsemble-5: only
post_transform NONE is native (onnxruntime 1.32 reads the others' codes differently from the
ONNX spec). The legacy ops add onnxruntime's finalization (``emit_legacy_tree_ensemble``,
``_binary_classifier``); PROBIT stays on the fallback.
"""

from __future__ import annotations

import weakref

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


# -- tree ensembles: TreeEnsemble (ai.onnx.ml 5), TreeEnsembleRegressor / Classifier (1-3) -----

# aggregate_function: AVERAGE, SUM, MIN, MAX (TreeEnsemble-5's codes; the legacy ops name them)
AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")
MEMBER = 6
LEGACY_MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ")
MAX_TREE_DEPTH = 4096
# post transforms rendered natively, by legacy name (TreeEnsemble-5: NONE only, see the doc)
POST_TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO")


def _node_dtype(split: np.dtype) -> np.dtype:
    """One tree node as the kernel reads it: a C struct of the same layout (``_NODE_STRUCT``),
    so a node's split, feature and successors share a cache line (a model of millions of nodes
    walks them from memory)."""
    return np.dtype([("split", split), ("feature", np.int32), ("yes", np.int32), ("no", np.int32),
                     ("mode", np.uint8), ("missing", np.uint8)], align=True)


_NODE_STRUCT = ("typedef struct {{ {t} split; int32_t feature, yes, no; uint8_t mode, missing; }} {name};")


class _Trees:
    """An ensemble as the kernel walks it, from either attribute form: ``nodes`` (per branch
    node its split, feature, mode, whether a NaN goes the true way, and its two successors: a
    node index, or -1 - a leaf index), ``roots`` (coded alike), per leaf a range of
    ``(target, weight)`` entries, and the membership sets of BRANCH_MEMBER nodes."""

    def __init__(self, split: np.dtype) -> None:
        self.split_dtype = split
        self.nodes = np.zeros(0, _node_dtype(split))
        self.roots: list[int] = []
        self.leaf_start = np.zeros(0, np.int64)
        self.leaf_count = np.zeros(0, np.int64)
        self.target = np.zeros(0, np.int64)
        self.weight = np.zeros(0, split)
        self.members = np.zeros(0, split)
        self.member_start = np.zeros(0, np.int64)
        self.member_count = np.zeros(0, np.int64)
        self.n_targets = 0
        self.why: str | None = None  # what makes the attributes unusable, if anything

    @property
    def one_entry_per_leaf(self) -> bool:
        return bool(len(self.leaf_count)) and bool(np.all(self.leaf_count == 1))

    @classmethod
    def from_v5(cls, node: Node, dtype: np.dtype) -> _Trees:
        """TreeEnsemble-5: nodes and leaves are separate lists, a successor flagged as a leaf."""
        arr = lambda key, dt: np.asarray(node.attr(key) if node.attr(key) is not None else [], dtype=dt)  # noqa: E731
        self = cls(dtype)
        feature, mode, split = arr("nodes_featureids", np.int64), arr("nodes_modes", np.int64), arr("nodes_splits", dtype)
        n = len(feature)
        miss = node.attr("nodes_missing_value_tracks_true")
        missing = np.asarray(miss if miss is not None else [0] * n, dtype=np.uint8)
        lists = {k: arr(f"nodes_{k}", np.int64) for k in ("trueleafs", "falseleafs", "truenodeids", "falsenodeids")}
        self.target, self.weight = arr("leaf_targetids", np.int64), arr("leaf_weights", dtype)
        self.n_targets = int(node.attr("n_targets") or 0)
        self.members = arr("membership_values", dtype)
        roots = arr("tree_roots", np.int64)
        if not n or not len(roots):
            self.why = "no nodes or no trees"
            return self
        for name, a in (("modes", mode), ("splits", split), ("missing_value_tracks_true", missing), *lists.items()):
            if len(a) != n:
                self.why = f"nodes_{name} of {len(a)} entries for {n} nodes"
                return self
        if len(self.target) != len(self.weight) or not len(self.target):
            self.why = "leaf_targetids / leaf_weights"
            return self
        if mode.min() < 0 or mode.max() > MEMBER:
            self.why = "node mode out of range"
            return self
        succ = {}
        for way, leaf, ids in ((True, lists["trueleafs"], lists["truenodeids"]), (False, lists["falseleafs"], lists["falsenodeids"])):
            bound = np.where(leaf != 0, len(self.target), n)
            if ids.min() < 0 or np.any(ids >= bound):
                self.why = "successor index out of range"
                return self
            succ[way] = np.where(leaf != 0, -1 - ids, ids)
        if roots.min() < 0 or roots.max() >= n:
            self.why = "tree root out of range"
            return self
        self.nodes = np.zeros(n, _node_dtype(dtype))
        self.nodes["split"], self.nodes["feature"], self.nodes["mode"], self.nodes["missing"] = split, feature, mode, missing
        self.nodes["yes"], self.nodes["no"] = succ[True], succ[False]
        # a root whose two ways are the same leaf is that leaf (a one-leaf tree)
        self.roots = [int(succ[True][r]) if succ[True][r] < 0 and succ[True][r] == succ[False][r] else int(r)
                      for r in roots]
        self.leaf_start, self.leaf_count = np.arange(len(self.target)), np.ones(len(self.target), np.int64)
        # membership sets, NaN-terminated, in node order (onnxruntime's reading)
        n_member = int(np.sum(mode == MEMBER))
        if int(np.sum(np.isnan(self.members))) != n_member:
            self.why = f"{int(np.sum(np.isnan(self.members)))} membership sets for {n_member} BRANCH_MEMBER nodes"
            return self
        self.member_start, self.member_count = np.zeros(n, np.int64), np.zeros(n, np.int64)
        pos = 0
        for k in np.flatnonzero(mode == MEMBER):
            end = pos
            while not np.isnan(self.members[end]):
                end += 1
            self.member_start[k], self.member_count[k] = pos, end - pos
            pos = end + 1
        return self

    @classmethod
    def from_legacy(cls, node: Node, dtype: np.dtype, prefix: str, n_targets: int) -> _Trees:
        """TreeEnsembleRegressor / Classifier (``prefix`` "target" / "class"): nodes named by
        (tree id, node id), LEAF a mode, weights attached to leaves by (tree id, node id), any
        number per leaf. As onnxruntime reads them: a tree's root is the first of a run of its
        nodes in the list; the weights of a leaf keep their order."""
        self = cls(dtype)
        self.n_targets = n_targets

        def arr(key: str, dt) -> np.ndarray:  # noqa: ANN001
            v = node.attr(key)
            if v is None:
                v = node.attr(f"{key}_as_tensor")  # opset 3's double-precision form
            return np.asarray(v if v is not None else [], dtype=dt)
        tree, ids, feature = arr("nodes_treeids", np.int64), arr("nodes_nodeids", np.int64), arr("nodes_featureids", np.int64)
        mode_names = np.asarray([m.decode() if isinstance(m, bytes) else str(m) for m in (node.attr("nodes_modes") or [])])
        split = arr("nodes_values", np.float64).astype(dtype)
        yes, no = arr("nodes_truenodeids", np.int64), arr("nodes_falsenodeids", np.int64)
        n = len(tree)
        miss = node.attr("nodes_missing_value_tracks_true")
        missing = np.asarray(miss if miss else [0] * n, np.int64)
        w_tree, w_node = arr(f"{prefix}_treeids", np.int64), arr(f"{prefix}_nodeids", np.int64)
        w_target, w_value = arr(f"{prefix}_ids", np.int64), arr(f"{prefix}_weights", np.float64).astype(dtype)
        if not n:
            self.why = "no nodes"
            return self
        for name, a in (("nodeids", ids), ("featureids", feature), ("modes", mode_names), ("values", split),
                        ("truenodeids", yes), ("falsenodeids", no), ("missing_value_tracks_true", missing)):
            if len(a) != n:
                self.why = f"nodes_{name} of {len(a)} entries for {n} nodes"
                return self
        if not (len(w_tree) == len(w_node) == len(w_target) == len(w_value)):
            self.why = f"{prefix}_treeids / nodeids / ids / weights of different lengths"
            return self
        names = np.asarray((*LEGACY_MODES, "LEAF"))
        known = np.isin(mode_names, names)
        if not known.all():
            self.why = f"node mode {mode_names[~known][0]!r}"
            return self
        mode = np.searchsorted(np.sort(names), mode_names)
        mode = np.argsort(names)[mode]  # index into LEGACY_MODES, LEAF last
        leaf = mode == len(LEGACY_MODES)
        if len(w_target) and (w_target.min() < 0 or w_target.max() >= n_targets):
            self.why = f"{prefix}_ids out of range for {n_targets} {'classes' if prefix == 'class' else 'targets'}"
            return self
        # (tree id, node id) -> position, by sorting the pairs once (millions of nodes in
        # LightGBM models: no Python loop per node)
        keys = np.stack([tree, ids], axis=1)
        order = np.lexsort((ids, tree))
        sorted_keys = keys[order]
        if n > 1 and np.any(np.all(sorted_keys[1:] == sorted_keys[:-1], axis=1)):
            dup = sorted_keys[1:][np.all(sorted_keys[1:] == sorted_keys[:-1], axis=1)][0]
            self.why = f"node {int(dup[1])} of tree {int(dup[0])} listed twice"
            return self

        # one flat key per pair: every id any list names fits below span - 1 (span - 1: absent)
        span = int(max(a.max(initial=0) for a in (ids, yes, no, w_node))) + 2
        flat = sorted_keys[:, 0] * span + sorted_keys[:, 1]

        def find(t: np.ndarray, i: np.ndarray) -> np.ndarray:
            """Positions of the (tree, node id) pairs; -1 where absent."""
            want = t * span + np.where(i < 0, span - 1, i)
            at = np.clip(np.searchsorted(flat, want), 0, n - 1)
            return np.where(flat[at] == want, order[at], -1)
        code = np.empty(n, np.int64)  # a node's index among branch nodes, or -1 - its leaf index
        code[~leaf] = np.arange(int((~leaf).sum()))
        code[leaf] = -1 - np.arange(int(leaf.sum()))
        branches = np.flatnonzero(~leaf)
        succ = {}
        for way, target in (("yes", yes), ("no", no)):
            at = find(tree[branches], target[branches])
            bad = (at < 0) | (at == branches)
            if bad.any():
                k = branches[np.argmax(bad)]
                self.why = f"node {int(ids[k])} of tree {int(tree[k])}: {way} successor {int(target[k])} missing or itself"
                return self
            succ[way] = code[at]
        self.nodes = np.zeros(len(branches), _node_dtype(dtype))
        self.nodes["split"], self.nodes["feature"] = split[branches], feature[branches]
        self.nodes["mode"], self.nodes["missing"] = mode[branches], missing[branches] == 1
        self.nodes["yes"], self.nodes["no"] = succ["yes"], succ["no"]
        starts = np.flatnonzero(np.r_[True, tree[1:] != tree[:-1]])
        self.roots = code[starts].tolist()
        # per leaf its weights, in the order listed (weights on branch nodes are never reached)
        at = find(w_tree, w_node) if len(w_tree) else np.zeros(0, np.int64)
        if np.any(at < 0):
            k = int(np.argmax(at < 0))
            self.why = f"a weight for node {int(w_node[k])} of tree {int(w_tree[k])}, which does not exist"
            return self
        on_leaf = np.flatnonzero(leaf[at]) if len(at) else at
        leaf_of = -1 - code[at[on_leaf]]
        by_leaf = on_leaf[np.argsort(leaf_of, kind="stable")]
        self.leaf_count = np.bincount(leaf_of, minlength=int(leaf.sum())).astype(np.int64)
        self.leaf_start = np.r_[0, np.cumsum(self.leaf_count)[:-1]].astype(np.int64)
        self.target, self.weight = w_target[by_leaf], w_value[by_leaf]
        return self

    def problem(self, features: int) -> str | None:
        if self.why:
            return self.why
        if len(self.nodes) and (self.nodes["feature"].min() < 0 or self.nodes["feature"].max() >= features):
            return "node feature out of range"
        if len(self.target) and (self.target.min() < 0 or self.target.max() >= self.n_targets):
            return "leaf target out of range"
        # every walk ends: follow all roots one level at a time (a cycle or a tree deeper than
        # the kernel walks keeps the frontier alive)
        frontier = np.unique([r for r in self.roots if r >= 0]).astype(np.int64)
        for _ in range(MAX_TREE_DEPTH):
            if not len(frontier):
                return None
            nxt = np.concatenate([self.nodes["yes"][frontier], self.nodes["no"][frontier]]).astype(np.int64)
            frontier = np.unique(nxt[nxt >= 0])
        return "a tree deeper than smelt walks (or a cycle)"


def _condition(mode: int) -> str:
    """C condition of branch ``mode`` on feature ``x``, node ``nd`` and its index ``k``."""
    if mode == MEMBER:
        return "({ int in_ = 0; for (long q = MS[k]; q < MS[k] + MC[k]; ++q) in_ |= x == MV[q]; in_; })"
    return {0: "x <= nd->split", 1: "x < nd->split", 2: "x >= nd->split", 3: "x > nd->split",
            4: "x == nd->split", 5: "x != nd->split"}[mode]


# Rows walk the trees in blocks of ROW_BLOCK: each tree is walked by every row of the block, one
# level per pass over the rows (an interleaved loop), before the next tree. The block's walks are
# independent, so their loads overlap instead of each waiting on the one before (a walk is a
# chain of dependent loads), and a tree's top levels are read once per block. Rows that reached
# a leaf step node 0 in place until the block's deepest walk ends: branch-free, where skipping
# them mispredicts on every leaf of an unbalanced tree. 8, measured on one thread at 1024 rows
# (a 500-tree ExtraTrees, 73k nodes; 300 full trees of depth 12, 1.2M nodes): 1.2x and 2.1x the
# row-at-a-time walk; 4 gains less on the large ensemble, 16 loses on the unbalanced one, and
# skipping finished rows by a branch costs 10-15%. Threads split the rows as before (a block
# never spans two threads; one row is a block of one, its walk as before). Trees are not split
# over threads for small batches: merging partial sums would change the order of the fold and
# so the last bits of SUM and AVERAGE. Each row folds its leaves in tree order, as before: the
# same bits as a row-at-a-time walk.
ROW_BLOCK = 8


def _walk(em: BlockEmitter, trees: _Trees, x_type: str, t: str, agg: str, hit: bool, features: int,
          score_row: str, hit_row: str) -> tuple[list[str], list[str]]:
    """C declarations and the body that walks every tree for the ``nb`` rows (at most
    ROW_BLOCK) from row ``r0`` of ``X`` and folds the leaves' weights into each row's scores
    (``score_row`` / ``hit_row``: C expressions of row ``i`` of the block's ``S`` and ``HIT``,
    which targets a leaf reached) as onnxruntime does: SUM and AVERAGE add in tree order, MIN
    and MAX keep the first hit then fold."""
    node_t = f"smelt_tree_node_{trees.split_dtype.name}"
    decls = [_NODE_STRUCT.format(t=t, name=node_t),
             f"const {node_t} *restrict ND = (const void *){em.weight(trees.nodes.view(np.uint8))};",
             f"const int64_t *restrict RT = {em.weight(np.asarray(trees.roots, np.int64))};",
             f"const int64_t *restrict LT = {em.weight(trees.target)}; const {t} *restrict LW = {em.weight(trees.weight)};"]
    if not trees.one_entry_per_leaf:
        decls.append(f"const int64_t *restrict LS = {em.weight(trees.leaf_start)}, *restrict LC = {em.weight(trees.leaf_count)};")
    modes = sorted({int(m) for m in trees.nodes["mode"]})
    if MEMBER in modes:
        members = trees.members if len(trees.members) else np.zeros(1, trees.split_dtype)
        decls += [f"const int64_t *restrict MS = {em.weight(trees.member_start)}, *restrict MC = {em.weight(trees.member_count)};",
                  f"const {t} *restrict MV = {em.weight(members)};"]
    if len(modes) == 1:  # one mode for every node (LightGBM's, XGBoost's): no switch
        branch = f"c = {_condition(modes[0])};"
    else:
        branch = "switch (nd->mode) { " + " ".join(f"case {m}: c = {_condition(m)}; break;" for m in modes) + " }"
    if agg in ("SUM", "AVERAGE"):
        fold = "S[j] += w;"
    else:  # onnxruntime: the first hit sets, later ones fold
        fold = f"if (!HIT[j] || w {'<' if agg == 'MIN' else '>'} S[j]) S[j] = w;"
    fold += " HIT[j] = 1;" if hit else ""
    if trees.one_entry_per_leaf:
        leaf = [f"                {{ const long j = LT[leaf]; const {t} w = LW[leaf]; {fold} }}"]
    else:
        leaf = ["                for (long e = LS[leaf]; e < LS[leaf] + LC[leaf]; ++e) {",
                f"                    const long j = LT[e]; const {t} w = LW[e]; {fold}", "                }"]
    missing = bool(trees.nodes["missing"].any()) if len(trees.nodes) else False
    hit_decl = f" uint8_t *restrict HIT = {hit_row};" if hit else ""
    def step(ind: str, row: str) -> list[str]:  # node k, row `row`: c, the way it goes
        return [f"{ind}const {node_t} *nd = ND + k; const {x_type} x = X[({row}) * {features}L + nd->feature]; int c = 0;",
                f"{ind}{branch}",
                *([f"{ind}if (x != x && nd->missing) c = 1;  /* a missing value goes the true way where asked */"]
                  if missing else [])]
    body = [f"    for (long tr = 0; tr < {len(trees.roots)}; ++tr) {{",
            f"        long cur[{ROW_BLOCK}];  /* per row: a node, or -1 - the leaf it reached */",
            "        if (nb == 1) {  /* one row: a plain walk (its node in a register, not cur[]) */",
            "            long k = RT[tr];",
            "            while (k >= 0) {",
            *step("                ", "r0"),
            "                k = c ? nd->yes : nd->no;",
            "            }",
            "            cur[0] = k;",
            "        } else {",
            "            for (long i = 0; i < nb; ++i) cur[i] = RT[tr];",
            "            for (int live = RT[tr] >= 0; live; ) {  /* a pass: every row one level down */",
            "                live = 0;",
            "                for (long i = 0; i < nb; ++i) {",
            "                    const long k = cur[i] < 0 ? 0 : cur[i];  /* a row at its leaf steps node 0, unused */",
            *step("                    ", "r0 + i"),
            "                    const long next = c ? nd->yes : nd->no;",
            "                    cur[i] = cur[i] < 0 ? cur[i] : next;",
            "                    live |= cur[i] >= 0;",
            "                }",
            "            }",
            "        }",
            "        for (long i = 0; i < nb; ++i) {  /* fold the leaves, rows apart */",
            f"            {{ {t} *restrict S = {score_row};{hit_decl} const long leaf = -1 - cur[i];",
            *leaf,
            "            }",
            "        }",
            "    }"]
    return decls, body


def _blocks(rows: int, n_trees: int, body: list[str], start: list[str], finish: list[str], t: str, n: int,
            score_row: str, hit_row: str, hit: bool) -> list[str]:
    """The rows loop: this thread's rows in blocks of ROW_BLOCK (``r0``, ``nb`` rows), ``start``
    per block, the trees' ``body``, then per row (``r``, its ``S`` and ``HIT``) ``finish``."""
    hit_decl = f" uint8_t *restrict HIT = {hit_row};" if hit else ""
    return [work_range(rows, rows * n_trees >= PARALLEL_MIN_ELEMS // 16),
            f"for (long r0 = wb; r0 < we; r0 += {ROW_BLOCK}) {{",
            f"    const long nb = we - r0 < {ROW_BLOCK} ? we - r0 : {ROW_BLOCK};",
            *start, *body,
            *([f"    for (long i = 0; i < nb; ++i) {{ const long r = r0 + i; (void)r; {t} *restrict S = {score_row};{hit_decl}",
               *["    " + ln for ln in finish], "    }"] if finish else []),
            "}"]


def _post_transform(post: str, t: str, n: int) -> list[str]:
    """C applying onnxruntime's ``post_transform`` to the ``n`` scores ``S`` in place (float
    math as onnxruntime's: the logistic of |v| mirrored, softmax from the maximum, SOFTMAX_ZERO
    leaving scores within 1e-7 of zero at ~0)."""
    if post == "LOGISTIC":
        return [f"    for (long j = 0; j < {n}; ++j) {{ const float v_ = 1.0f / (1.0f + expf(-fabsf((float)S[j]))); "
                "S[j] = S[j] < 0 ? 1.0f - v_ : v_; }"]
    if post == "SOFTMAX":
        exp = "exp" if t == "double" else "expf"
        return [f"    {{ {t} m_ = -FLT_MAX, z_ = 0; for (long j = 0; j < {n}; ++j) m_ = S[j] > m_ ? S[j] : m_;",
                f"      for (long j = 0; j < {n}; ++j) {{ S[j] = {exp}(S[j] - m_); z_ += S[j]; }}",
                f"      for (long j = 0; j < {n}; ++j) S[j] /= z_; }}"]
    if post == "SOFTMAX_ZERO":
        return [f"    {{ float m_ = -FLT_MAX, z_ = 0; for (long j = 0; j < {n}; ++j) m_ = S[j] > m_ ? S[j] : m_;",
                "      const float e_ = expf(-m_);",
                f"      for (long j = 0; j < {n}; ++j) {{ if (S[j] > 1e-7f || S[j] < -1e-7f) {{ S[j] = expf((float)S[j] - m_); "
                "z_ += S[j]; } else S[j] *= e_; }",
                f"      for (long j = 0; j < {n}; ++j) S[j] /= z_; }}"]
    return []


def _x_ok(g: Graph, node: Node, types: tuple[str, ...]) -> tuple[list[int], str | None]:
    x = node.inputs[0]
    xs = [int(d) for d in g.values[x].shape]
    if dtype_name(g, x) not in types:
        return xs, f"{node.op} of {dtype_name(g, x)} (native: {', '.join(types)})"
    if len(xs) != 2:
        return xs, f"{node.op} X must be [N, F]"
    return xs, None


# -- TreeEnsemble-5

def _check_tree(node: Node, g: Graph) -> str | None:
    xs, why = _x_ok(g, node, FLOAT_TYPES)
    if why:
        return why
    if dtype_name(g, node.outputs[0]) != dtype_name(g, node.inputs[0]):
        return "output type"
    if int(node.attr("post_transform", 0) or 0) != 0:
        return "post_transform other than NONE"
    if int(node.attr("aggregate_function", 1)) not in range(len(AGGREGATES)):
        return f"aggregate_function {node.attr('aggregate_function')}"
    trees = _Trees.from_v5(node, np.dtype(dtype_name(g, node.inputs[0])))
    why = trees.problem(xs[1])
    if why:
        return why
    if [int(d) for d in g.values[node.outputs[0]].shape] != [xs[0], trees.n_targets]:
        return "output shape"
    return None


@register("TreeEnsemble", check=_check_tree, name="tree_ensemble", domain=ML)
def emit_tree_ensemble(node: Node, g: Graph, em: BlockEmitter) -> None:
    x, y = node.inputs[0], node.outputs[0]
    dt = dtype_name(g, x)
    t = c_type(dt)
    rows, features = (int(d) for d in g.values[x].shape)
    trees = _Trees.from_v5(node, np.dtype(dt))
    nt = trees.n_targets
    agg = AGGREGATES[int(node.attr("aggregate_function", 1))]
    hit = agg in ("MIN", "MAX")
    score_row, hit_row = f"Y + (r0 + i) * {nt}L", f"HITB + i * {nt}L"
    decls, walk = _walk(em, trees, t, t, agg, hit, features, score_row, hit_row)
    scratch = em.scratch(em.n_threads * ROW_BLOCK * nt, "uint8") if hit else None
    start = [f"    for (long q = 0; q < nb * {nt}L; ++q) Y[r0 * {nt}L + q] = 0;",
             *([f"    for (long q = 0; q < nb * {nt}L; ++q) HITB[q] = 0;"] if scratch else [])]
    finish = [f"    for (long j = 0; j < {nt}; ++j) S[j] /= ({t}){len(trees.roots)};"] if agg == "AVERAGE" else []
    lines = [*decls, f"const {t} *restrict X = {em.ptr(x)};", f"{t} *restrict Y = (void *){em.ptr(y)};",
             *([f"uint8_t *restrict HITB = {scratch} + (long)tid * {ROW_BLOCK * nt};"] if scratch else []),
             *_blocks(rows, len(trees.roots), walk, start, finish, t, nt, score_row, hit_row, hit)]
    emit_kernel(em, f"tree_ensemble_{dt}", "\n".join(lines),
                f"TreeEnsemble of {len(trees.roots)} trees, {len(trees.nodes)} nodes, {len(trees.target)} leaves, "
                f"{nt} targets, aggregate {agg}, {rows} rows")


# -- TreeEnsembleRegressor / TreeEnsembleClassifier (ai.onnx.ml 1-3)

LEGACY_X_TYPES = ("float32", "float64", "int64", "int32")


# _legacy's answers per graph (freed with it), by node and the identity of its node list: the
# check and the emitter ask for the same node, and a LightGBM model's tables take a second
_LEGACY_CACHE: weakref.WeakKeyDictionary[Graph, dict[tuple, tuple[object, tuple]]] = weakref.WeakKeyDictionary()


def _legacy(node: Node, g: Graph) -> tuple[_Trees | None, list[float], str | None]:
    """The ensemble, its base values and what keeps it off the native path (None: nothing)."""
    ident = node.attr("nodes_treeids")
    x = g.values[node.inputs[0]]
    small = tuple(sorted((k, repr(v)) for k, v in node.attrs.items() if not isinstance(v, list) or len(v) <= 64))
    key = (node.op, node.name, id(ident), small, str(x.dtype), tuple(x.shape or ()))
    memo = _LEGACY_CACHE.setdefault(g, {})
    hit = memo.get(key)
    if hit is not None and hit[0] is ident:
        return hit[1]
    answer = _legacy_uncached(node, g)
    memo[key] = (ident, answer)  # the reference keeps the id from being reused
    return answer


def _legacy_uncached(node: Node, g: Graph) -> tuple[_Trees | None, list[float], str | None]:
    xs, why = _x_ok(g, node, LEGACY_X_TYPES)
    if why:
        return None, [], why
    classifier = node.op == "TreeEnsembleClassifier"
    if classifier:
        if node.attr("classlabels_strings") is not None:
            return None, [], "string class labels"
        n = len(node.attr("classlabels_int64s") or [])
    else:
        n = int(node.attr("n_targets") or 0)
    if n < (2 if classifier else 1):
        return None, [], f"{n} {'classes' if classifier else 'targets'}"
    split = np.dtype(np.float64 if dtype_name(g, node.inputs[0]) == "float64" else np.float32)
    trees = _Trees.from_legacy(node, split, "class" if classifier else "target", n)
    why = trees.problem(xs[1])
    if why:
        return None, [], why
    base = node.attr("base_values")
    base = [float(v) for v in (base if base is not None else node.attr("base_values_as_tensor") or [])]
    if len(base) not in (0, n):
        return None, [], f"{len(base)} base_values for {n} {'classes' if classifier else 'targets'}"
    post = _text(node.attr("post_transform", "NONE"))
    if post not in POST_TRANSFORMS or (post != "NONE" and n == 1):
        return None, [], f"post_transform {post} with {n} outputs"  # onnxruntime's one-output path differs
    if not classifier and _text(node.attr("aggregate_function", "SUM")) not in AGGREGATES:
        return None, [], f"aggregate_function {node.attr('aggregate_function')}"
    if classifier and not len(base) and np.any(trees.leaf_count == 0):
        return None, [], "a leaf with no class weight (onnxruntime reads past its labels there)"
    if not classifier and n == 1 and np.any(trees.leaf_count != 1):
        return None, [], "a leaf without exactly one weight (onnxruntime's one-target path reads the first)"
    return trees, base, None


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _check_legacy(node: Node, g: Graph) -> str | None:
    _, _, why = _legacy(node, g)
    return why


def _binary_classifier(trees: _Trees, base: list[float], t: str, post: str, label: bool, scores: bool) -> list[str]:
    """C for onnxruntime's two-class rules, per row, after the fold (``S``, ``HIT``).

    With base values: if class 1 was reached its score becomes base_values[1] plus class 0's and
    class 0's the negation (base_values[0] unused), else each adds its own. Without: a row
    that did not reach class 1 has one score. The positive weight is class 1's score if
    reached, else class 0's (0 if neither). When the weights name one class only (LightGBM's
    and XGBoost's binary form) the label is the second class above 0.5 (all weights positive)
    or 0, else the first; otherwise it is the index 1 or 0 by the positive weight's sign
    (onnxruntime returns the index there, whatever the labels). A reached-nowhere score reads
    as 0. One score is written as (logistic(-s), logistic(s)) under LOGISTIC, else as (1 - s, s)
    after a 0.5 threshold and (-s, s) after a sign test; two scores take the post transform."""
    one_class = len(set(trees.target.tolist())) == 1
    positive = bool(np.all(trees.weight >= 0))
    lines = ["    {"]
    if base:
        lines.append("      if (HIT[1]) { S[1] = B[1] + S[0]; S[0] = -S[1]; } else { S[1] += B[1]; S[0] += B[0]; }")
    lines += [f"      const int single = {0 if base else 1} && !HIT[1];  /* onnxruntime drops class 1's score */",
              f"      const {t} pos = !single && HIT[1] ? S[1] : HIT[0] ? S[0] : 0;"]
    if one_class:
        cut = "0.5" if positive else "0"
        lines.append(f"      const int upper = pos > {cut};  /* one class weighted: the threshold decides */")
        if label:
            lines.append("      L[r] = LABELS[upper];")
    elif label:
        lines.append("      L[r] = pos > 0 ? 1 : 0;  /* onnxruntime: the index, whatever the labels */")
    if scores:
        lines += ["      if (!HIT[0]) S[0] = 0;", "      if (!HIT[1]) S[1] = 0;",
                  "      if (single) {", f"        const {t} s_ = S[0];"]
        if post == "LOGISTIC":
            lines += ["        S[0] = -s_; S[1] = s_;"] + ["  " + ln for ln in _post_transform(post, t, 2)]
        elif one_class and positive:
            lines.append("        S[0] = 1 - s_; S[1] = s_;")
        else:
            lines.append("        S[0] = -s_; S[1] = s_;")
        lines += ["      } else {", *["  " + ln for ln in _post_transform(post, t, 2)], "      }",
                  "      Z[r * 2L] = (float)S[0]; Z[r * 2L + 1] = (float)S[1];"]
    lines.append("    }")
    return lines


@register(("TreeEnsembleRegressor", "TreeEnsembleClassifier"), check=_check_legacy, name="legacy_tree_ensemble",
          domain=ML)
def emit_legacy_tree_ensemble(node: Node, g: Graph, em: BlockEmitter) -> None:
    """Scores as onnxruntime finalizes them: the fold in the split's precision (double for a
    double X, else float), AVERAGE divided by the tree count, base values added, a score no leaf
    of the row reached written as 0 whatever its base value (a classifier's base values count as
    reached), the post transform, then float32. A classifier's label: the class of the highest
    score among those reached (the first on a tie); two classes follow ``_binary_classifier``."""
    classifier = node.op == "TreeEnsembleClassifier"
    trees, base, _ = _legacy(node, g)
    assert trees is not None
    x = node.inputs[0]
    xt, t = c_type(dtype_name(g, x)), c_type(trees.split_dtype.name)
    rows, features = (int(d) for d in g.values[x].shape)
    n = trees.n_targets
    agg = "SUM" if classifier else _text(node.attr("aggregate_function", "SUM"))
    post = _text(node.attr("post_transform", "NONE"))
    # onnxruntime writes a score no leaf of the row reached as 0, base value or not: with more
    # than one target the kernel tracks which were reached
    hit = classifier or agg in ("MIN", "MAX") or n > 1
    score_row, hit_row = f"SB + i * {n}L", f"HITB + i * {n}L"
    decls, walk = _walk(em, trees, xt, t, agg, hit, features, score_row, hit_row)
    scores = em.scratch(em.n_threads * ROW_BLOCK * n * trees.split_dtype.itemsize, trees.split_dtype.name)
    flags = em.scratch(em.n_threads * ROW_BLOCK * n, "uint8") if hit else None
    label = node.outputs[0] if classifier else ""
    z = (node.outputs[1] if len(node.outputs) > 1 else "") if classifier else node.outputs[0]
    if classifier and label:
        decls.append(f"const int64_t *restrict LABELS = {em.weight(np.asarray(node.attr('classlabels_int64s'), np.int64))};")
    if base:
        decls.append(f"const {t} *restrict B = {em.weight(np.asarray(base, trees.split_dtype))};")
    start = [f"    for (long q = 0; q < nb * {n}L; ++q) SB[q] = 0;",
             *([f"    for (long q = 0; q < nb * {n}L; ++q) HITB[q] = 0;"] if flags else [])]
    finish = []
    if agg == "AVERAGE":
        finish.append(f"    for (long j = 0; j < {n}; ++j) S[j] /= ({t}){len(trees.roots)};")
    if classifier and n == 2:
        finish += _binary_classifier(trees, base, t, post, bool(label), bool(z))
    else:
        if base and classifier:  # base values count as reached
            finish.append(f"    for (long j = 0; j < {n}; ++j) {{ S[j] += B[j]; HIT[j] = 1; }}")
        elif base:
            finish.append(f"    for (long j = 0; j < {n}; ++j) S[j] += B[j];")
        if hit:  # onnxruntime writes a score no leaf of the row reached as 0, base value or not
            finish.append(f"    for (long j = 0; j < {n}; ++j) if (!HIT[j]) S[j] = 0;")
        if label:
            finish += [f"    {{ long best = -1; for (long j = 0; j < {n}; ++j) "
                       "if (HIT[j] && (best < 0 || S[j] > S[best])) best = j; L[r] = LABELS[best]; }"]
        if z:
            finish += _post_transform(post, t, n)
            finish.append(f"    for (long j = 0; j < {n}; ++j) Z[r * {n}L + j] = (float)S[j];")
    lines = [*decls, f"const {xt} *restrict X = {em.ptr(x)};",
             *([f"float *restrict Z = (void *){em.ptr(z)};"] if z else []),
             *([f"int64_t *restrict L = (void *){em.ptr(label)};"] if label else []),
             f"{t} *restrict SB = {scores} + (long)tid * {ROW_BLOCK * n};",
             *([f"uint8_t *restrict HITB = {flags} + (long)tid * {ROW_BLOCK * n};"] if flags else []),
             *_blocks(rows, len(trees.roots), walk, start, finish, t, n, score_row, hit_row, hit)]
    emit_kernel(em, f"{node.op.lower()}_{dtype_name(g, x)}", "\n".join(lines),
                f"{node.op} of {len(trees.roots)} trees, {len(trees.nodes)} branch nodes, {len(trees.leaf_count)} leaves, "
                f"{n} {'classes' if classifier else 'targets'}, aggregate {agg}, post {post}, {rows} rows")
