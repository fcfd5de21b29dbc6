#!/usr/bin/env python
"""Run every ONNX backend node test through smelt and onnxruntime; write docs/conformance.md.

    python tests/conformance/run_conformance.py                # all cases, 2 worker processes
    python tests/conformance/run_conformance.py -k conv -j 1   # cases whose name matches a regex
    python tests/conformance/run_conformance.py --no-doc --json results.json

Each case runs in a worker process, so a crash (or a hang: see ``--timeout``) in generated
code is recorded as that case's failure instead of ending the run. The summary counts cases
onnxruntime passes, cases smelt passes, smelt's passes among onnxruntime's (the conformance
ratio), and how many of smelt's runs were fully native versus used the onnx.reference
fallback for at least one node.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import re
import shlex
import sys
import time
from collections import defaultdict
from multiprocessing.connection import Connection, wait
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))

from conformance.cases import (  # noqa: E402
    ZOO_OPS,
    CaseResult,
    NodeCase,
    all_cases,
    cases_by_name,
    run_case,
)

DOC = ROOT / "docs" / "conformance.md"
MIN_RATIO = 0.80


# -- workers ----------------------------------------------------------------------------------
def _worker(conn: Connection) -> None:
    cases = cases_by_name()
    while True:
        name = conn.recv()
        if name is None:
            return
        try:
            result = run_case(cases[name]).to_json()
        except BaseException as exc:  # noqa: BLE001 - report, never die silently
            result = CaseResult(name, cases[name].op, False, "harness error", False,
                                f"harness error: {type(exc).__name__}: {exc}", None).to_json()
        conn.send(result)


class _Slot:
    def __init__(self, ctx) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.case: str | None = None
        self.started = 0.0

    def give(self, name: str) -> None:
        self.case, self.started = name, time.monotonic()
        self.conn.send(name)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()


def _lost(case: NodeCase, why: str, seconds: float) -> dict:
    return CaseResult(case.name, case.op, False, f"not run ({why} in the smelt run)", False,
                      f"{why} (process died or hung running this case)", None, [], seconds).to_json()


def run_all(cases: list[NodeCase], jobs: int, timeout: float, progress: bool = True) -> list[dict]:
    """Run ``cases`` on ``jobs`` worker processes; a crashed or hung worker is replaced."""
    ctx = mp.get_context("fork")  # cases are collected once, in the parent
    all_cases()
    pending = [c.name for c in cases]
    pending.reverse()
    by_name = {c.name: c for c in cases}
    results: list[dict] = []
    bar = _progress(len(cases), progress)
    slots = [_Slot(ctx) for _ in range(max(1, min(jobs, len(cases))))]
    try:
        for s in slots:
            if pending:
                s.give(pending.pop())
        while any(s.case for s in slots):
            busy = [s for s in slots if s.case]
            ready = wait([s.conn for s in busy] + [s.proc.sentinel for s in busy], timeout=1.0)
            now = time.monotonic()
            for i, s in enumerate(slots):
                if not s.case:
                    continue
                res = None
                if s.conn in ready:
                    try:
                        res = s.conn.recv()
                    except (EOFError, OSError):
                        res = None
                if res is None and (s.proc.sentinel in ready or not s.proc.is_alive()):
                    code = s.proc.exitcode
                    res = _lost(by_name[s.case], f"crash (exit code {code})", now - s.started)
                    s.kill()
                    slots[i] = s = _Slot(ctx)
                elif res is None and now - s.started > timeout:
                    res = _lost(by_name[s.case], f"timeout after {timeout:.0f} s", now - s.started)
                    s.kill()
                    slots[i] = s = _Slot(ctx)
                if res is None:
                    continue
                results.append(res)
                bar(res)
                s.case = None
                if pending:
                    s.give(pending.pop())
    finally:
        for s in slots:
            try:
                s.conn.send(None)
            except OSError:
                pass
            s.proc.join(timeout=5)
            if s.proc.is_alive():
                s.kill()
        bar(None)
    order = {c.name: k for k, c in enumerate(cases)}
    return sorted(results, key=lambda r: order[r["name"]])


def _progress(total: int, enabled: bool):
    """A callback advancing a progress display (tqdm when installed, else plain lines)."""
    if not enabled:
        return lambda r: None
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    counts = {"done": 0, "smelt": 0, "ort": 0}
    if tqdm is not None:
        pbar = tqdm(total=total, desc="conformance", file=sys.stderr, dynamic_ncols=True)

        def tick(r):
            if r is None:
                pbar.close()
                return
            counts["smelt"] += r["smelt_pass"]
            counts["ort"] += r["ort_pass"]
            pbar.set_postfix(smelt=counts["smelt"], ort=counts["ort"], refresh=False)
            pbar.update(1)
        return tick
    start = time.monotonic()

    def plain(r):
        if r is None:
            return
        counts["done"] += 1
        counts["smelt"] += r["smelt_pass"]
        counts["ort"] += r["ort_pass"]
        n = counts["done"]
        if n % 50 == 0 or n == total:
            print(f"conformance: {n}/{total} cases, smelt passes {counts['smelt']}, "
                  f"onnxruntime passes {counts['ort']}, {time.monotonic() - start:.0f} s",
                  file=sys.stderr, flush=True)
    return plain


# -- root causes ------------------------------------------------------------------------------
CAUSES = {
    "sequence": "sequence/optional values: smelt's API and runtime are tensor-only (`CompiledModel._check_feed` "
                "and `_FallbackRunner.run` call `np.asarray` on lists and None)",
    "domain": "`compiler._check_fallbacks` rejects domains other than ai.onnx / ai.onnx.ml, though "
              "onnx.reference runs them (ai.onnx.preview, ai.onnx.preview.training)",
    "reference": "onnx.reference itself (the fallback) fails the case: missing Pillow, a random op, "
                 "or a reference bug",
    "scalar": "0-d (scalar) inputs become shape (1,): `np.ascontiguousarray` in `CompiledModel._check_feed` "
              "(api.py)",
    "upgrade": "opset < 11 model upgraded by onnx's version converter, which changed the graph inputs' shapes "
               "(`onnx_import._upgrade_opset`)",
    "other": "not classified",
}


def _reference_passes(case: NodeCase) -> bool:
    from onnx.reference import ReferenceEvaluator

    from conformance.cases import assert_similar_outputs, feeds_for, normalize

    try:
        ref = ReferenceEvaluator(case.model)
        for inputs, outputs in case.data_sets:
            got = ref.run(None, feeds_for(case.model, inputs))
            assert_similar_outputs([normalize(o) for o in outputs], got, case.rtol, case.atol)
    except Exception:
        return False
    return True


def classify(case: NodeCase, result: dict) -> str:
    """The root cause of one smelt failure (heuristics checked against the failures seen)."""
    import numpy as np

    from conformance.cases import normalize

    err = result["smelt_error"] or ""
    if not case.tensor_only:
        return "sequence"
    if "custom domain" in err:
        return "domain"
    opset = max((o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx")), default=99)
    if opset < 11 and "expected shape" in err:
        return "upgrade"
    if not _reference_passes(case):
        return "reference"
    if any(isinstance(x, np.ndarray) and x.ndim == 0 for ins, _ in case.data_sets for x in map(normalize, ins)):
        return "scalar"
    return "other"


# -- summary ----------------------------------------------------------------------------------
def summarize(results: list[dict]) -> dict:
    ort = [r for r in results if r["ort_pass"]]
    both = [r for r in ort if r["smelt_pass"]]
    smelt_ok = [r for r in results if r["smelt_pass"]]
    return {
        "total": len(results),
        "ort_pass": len(ort),
        "smelt_pass": len(smelt_ok),
        "smelt_pass_among_ort": len(both),
        "ratio": len(both) / len(ort) if ort else 0.0,
        "smelt_only": len([r for r in smelt_ok if not r["ort_pass"]]),
        "native": len([r for r in results if r["smelt_native"] is True]),
        "fallback": len([r for r in results if r["smelt_native"] is False]),
        "not_compiled": len([r for r in results if r["smelt_native"] is None]),
        "native_pass": len([r for r in smelt_ok if r["smelt_native"] is True]),
        "fallback_pass": len([r for r in smelt_ok if r["smelt_native"] is False]),
        # issue 15's target: onnxruntime's passes that smelt also passes with no fallback node
        "native_among_ort": len([r for r in both if r["smelt_native"] is True]),
    }


def _md(text: str | None) -> str:
    text = (text or "").replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= 160 else text[:157] + "..."


def render_doc(results: list[dict], summary: dict, command: str, elapsed: float,
               causes: dict[str, str] | None = None) -> str:
    import numpy
    import onnx
    import onnxruntime

    from conformance.cases import smelt_threads

    s = summary
    pct = lambda a, b: f"{100.0 * a / b:.1f}%" if b else "n/a"  # noqa: E731
    lines = [
        "# ONNX backend node-test conformance",
        "",
        "Every node test case of the installed `onnx` package (`onnx.backend.test.case.node`,",
        "generated offline: no download) is run through `smelt.InferenceSession` and through",
        "`onnxruntime.InferenceSession` (CPU provider), and compared with the expected outputs",
        "the way `onnx.backend.test.runner` does: same number of outputs, shapes and dtypes,",
        "then `np.testing.assert_allclose(rtol, atol)` with the case's tolerances (rtol 1e-3,",
        "atol 1e-7). Sequence outputs are compared element by element; an empty optional must",
        "come back as `None`. A model onnxruntime refuses to load (newer IR version or opset",
        "than it supports, unsupported type) counts as an onnxruntime failure.",
        "",
        "Regenerate with the command below; `pytest tests/conformance` runs the cases of the ops",
        "the built-in zoo uses, `pytest -m slow tests/conformance` runs all of them.",
        "",
        "## Run",
        "",
        f"- date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- command: `{command}`",
        f"- onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}, numpy {numpy.__version__}, "
        f"Python {platform.python_version()}, {platform.machine()}",
        f"- smelt threads per session: {smelt_threads() or 'default (physical cores)'}; "
        f"wall time {elapsed / 60:.1f} min (compiled artifacts are cached; a cold cache takes ~6 min on 2 cores)",
        "",
        "## Summary",
        "",
        "| | cases |",
        "|---|---:|",
        f"| total node test cases | {s['total']} |",
        f"| onnxruntime passes | {s['ort_pass']} ({pct(s['ort_pass'], s['total'])}) |",
        f"| smelt passes | {s['smelt_pass']} ({pct(s['smelt_pass'], s['total'])}) |",
        f"| **smelt passes among onnxruntime's passes** | **{s['smelt_pass_among_ort']} / {s['ort_pass']} "
        f"= {pct(s['smelt_pass_among_ort'], s['ort_pass'])}** (target ≥ {MIN_RATIO:.0%}) |",
        f"| smelt passes that onnxruntime fails | {s['smelt_only']} |",
        f"| smelt ran fully native (no fallback node) | {s['native']} ({s['native_pass']} pass) |",
        f"| **fully native among onnxruntime's passes** | **{s['native_among_ort']} / {s['ort_pass']} "
        f"= {pct(s['native_among_ort'], s['ort_pass'])}** (target ≥ 90%) |",
        f"| smelt used the onnx.reference fallback for ≥ 1 node | {s['fallback']} ({s['fallback_pass']} pass) |",
        f"| smelt failed before compiling | {s['not_compiled']} |",
        "",
    ]
    zoo = [r for r in results if r["op"] in ZOO_OPS]
    lines += [
        "## Ops of the built-in zoo models",
        "",
        "The cases `pytest tests/conformance` runs by default (sequence/optional cases skipped).",
        "",
        "| op | cases | smelt passes | fully native | fallback ops used |",
        "|---|---:|---:|---:|---|",
    ]
    for op in ZOO_OPS:
        rs = [r for r in zoo if r["op"] == op]
        used = sorted({o for r in rs for o in r["fallback_ops"]})
        lines.append(f"| {op} | {len(rs)} | {sum(r['smelt_pass'] for r in rs)} | "
                     f"{sum(r['smelt_native'] is True for r in rs)} | {', '.join(used) or '-'} |")
    lines.append(f"| **all** | {len(zoo)} | {sum(r['smelt_pass'] for r in zoo)} | "
                 f"{sum(r['smelt_native'] is True for r in zoo)} | |")
    lines.append("")
    # fallback usage by op
    fb_ops: dict[str, int] = defaultdict(int)
    for r in results:
        for op in r["fallback_ops"]:
            fb_ops[op] += 1
    # failures grouped by op
    fails = [r for r in results if not r["smelt_pass"]]
    by_op: dict[str, list[dict]] = defaultdict(list)
    for r in fails:
        by_op[r["op"]].append(r)
    if causes:
        groups: dict[str, list[dict]] = defaultdict(list)
        for r in fails:
            groups[causes.get(r["name"], "other")].append(r)
        lines += [
            "## Root causes of smelt's failures",
            "",
            "Each failing case is classified by `classify()` in the script (the fallback is checked by",
            "running onnx.reference alone on the case).",
            "",
            "| root cause | smelt fails | ORT passes of those | example |",
            "|---|---:|---:|---|",
        ]
        for key, rs in sorted(groups.items(), key=lambda kv: (-sum(r["ort_pass"] for r in kv[1]), -len(kv[1]))):
            ex = next((r for r in rs if r["ort_pass"]), rs[0])
            lines.append(f"| {CAUSES[key]} | {len(rs)} | {sum(r['ort_pass'] for r in rs)} | `{ex['name']}` |")
        lines.append("")
    lines += [
        "## smelt failures by op",
        "",
        "Cases smelt fails, grouped by the operator under test (`*_expanded` cases test the",
        "operator's function body, i.e. other ops). *ORT* is how many of them onnxruntime passes:",
        "only those count against smelt's ratio. The error is the first line of the first",
        "failing case's error.",
        "",
        "| op | smelt fails | ORT passes of those | first failing case | first error line |",
        "|---|---:|---:|---|---|",
    ]
    for op, rs in sorted(by_op.items(), key=lambda kv: (-sum(r["ort_pass"] for r in kv[1]), -len(kv[1]), kv[0])):
        first = next((r for r in rs if r["ort_pass"]), rs[0])
        lines.append(f"| {op} | {len(rs)} | {sum(r['ort_pass'] for r in rs)} | `{first['name']}` | "
                     f"{_md(first['smelt_error'])} |")
    lines += [
        "",
        "## All smelt failures that onnxruntime passes",
        "",
        "| case | op | native | smelt error (first line) |",
        "|---|---|---|---|",
    ]
    for r in fails:
        if r["ort_pass"]:
            nat = {True: "yes", False: "fallback", None: "-"}[r["smelt_native"]]
            lines.append(f"| `{r['name']}` | {r['op']} | {nat} | {_md(r['smelt_error'])} |")
    ort_fail: dict[str, int] = defaultdict(int)
    for r in results:
        if not r["ort_pass"]:
            ort_fail[_ort_reason(r["ort_error"])] += 1
    lines += [
        "",
        "## Why onnxruntime fails cases",
        "",
        "| reason | cases |",
        "|---|---:|",
    ]
    for why, n in sorted(ort_fail.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {_md(why)} | {n} |")
    lines += [
        "",
        "## Ops smelt ran through the fallback",
        "",
        "Number of cases in which at least one node of the op ran through `onnx.reference`.",
        "",
        "| op | cases |",
        "|---|---:|",
    ]
    for op, n in sorted(fb_ops.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"| {op} | {n} |")
    return "\n".join(lines) + "\n"


def _ort_reason(err: str | None) -> str:
    err = err or ""
    m = re.search(r"Unsupported model IR version: \d+, max supported IR version: \d+", err)
    if m:
        return "load: " + re.sub(r"version: \d+,", "version: N,", m.group(0))
    if "opset" in err.lower() and ("not supported" in err.lower() or "is under development" in err):
        return "load: opset newer than onnxruntime supports"
    if "NOT_IMPLEMENTED" in err or "Could not find an implementation" in err:
        return "load: no CPU kernel for this op/type"
    if err.startswith("load:"):
        return "load: other (invalid graph, unsupported type, ...)"
    if err.startswith("AssertionError") or "Not equal" in err or "Mismatch" in err:
        return "wrong result"
    return "run error"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", "--filter", help="only cases whose name matches this regular expression")
    ap.add_argument("-j", "--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="worker processes (default: 2)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per case before it counts as hung")
    ap.add_argument("--json", type=Path, help="also write every case's result as JSON here")
    ap.add_argument("--no-doc", action="store_true", help=f"do not write {DOC.relative_to(ROOT)}")
    ap.add_argument("--quiet", action="store_true", help="no progress display")
    args = ap.parse_args(argv)

    cases = list(all_cases())
    if args.filter:
        rx = re.compile(args.filter)
        cases = [c for c in cases if rx.search(c.name)]
    print(f"{len(cases)} node test cases, {args.jobs} worker processes", file=sys.stderr)
    start = time.monotonic()
    results = run_all(cases, args.jobs, args.timeout, progress=not args.quiet)
    elapsed = time.monotonic() - start
    s = summarize(results)
    print(f"\ntotal {s['total']}  onnxruntime pass {s['ort_pass']}  smelt pass {s['smelt_pass']}  "
          f"smelt pass among onnxruntime passes {s['smelt_pass_among_ort']}/{s['ort_pass']} "
          f"({100 * s['ratio']:.1f}%)  native {s['native']}  fallback {s['fallback']}  "
          f"not compiled {s['not_compiled']}  [{elapsed:.0f} s]")
    fails = defaultdict(list)
    for r in results:
        if r["ort_pass"] and not r["smelt_pass"]:
            fails[r["op"]].append(r)
    for op, rs in sorted(fails.items(), key=lambda kv: -len(kv[1])):
        print(f"  {op:28s} {len(rs):4d}  {rs[0]['name']}: {rs[0]['smelt_error']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    by_name = cases_by_name()
    causes = {r["name"]: classify(by_name[r["name"]], r) for r in results if not r["smelt_pass"]}
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in results:
        if r["name"] in causes:
            counts[causes[r["name"]]][0] += 1
            counts[causes[r["name"]]][1] += r["ort_pass"]
    if counts:
        print("root causes of smelt failures (cases, of which onnxruntime passes):")
    for key, (n, n_ort) in sorted(counts.items(), key=lambda kv: (-kv[1][1], -kv[1][0])):
        print(f"  {n:4d} {n_ort:4d}  {CAUSES[key]}")
    if not args.no_doc:
        rel = Path(sys.argv[0]).resolve()
        try:
            rel = rel.relative_to(ROOT)
        except ValueError:
            pass
        extra = " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
        command = f"python {rel.as_posix()}" + (f" {extra}" if extra else "")
        DOC.parent.mkdir(parents=True, exist_ok=True)
        DOC.write_text(render_doc(results, s, command, elapsed, causes))
        print(f"wrote {DOC}", file=sys.stderr)
    return 0 if s["ratio"] >= MIN_RATIO or args.filter else 1


if __name__ == "__main__":
    sys.exit(main())
