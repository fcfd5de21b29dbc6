"""`smelt bench` harness logic on tiny models: interleaving, checking, skipping, the JSON contract.

Nothing here asserts on a measured time: the machine is shared, so speed belongs in
benchmarks. Rounds are 2 and timing windows a fraction of a second.
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
import onnx
import pytest
from helpers import const, make_model, tensor
from onnx import helper

from smelt.bench import harness, report
from smelt.bench.engines import ENGINES, BenchModel, EngineUnavailable, Runner, parse_engines
from smelt.bench.suites import CNN_SUITE, rnn_suite, suite_models
from smelt.bench.timing import time_interleaved
from smelt.frontend import zoo

jsonschema = pytest.importorskip("jsonschema")

# the peers report the host's ISA, whichever it is: the fake machine has a peak for each
FAKE_MACHINE = {"cpu": "test", "isa": "avx512", "smelt_isa": "avx512", "cores": 2, "python": "3",
                "caches": {"l1d_kib": 32, "l2_kib": 1024, "l3_kib": 32768}, "peak_gflops": 100.0,
                "peaks": {"avx512": 100.0, "avx2": 50.0}, "peak": None}
FAKE_PEAK = {"isa": "avx512", "vector_bits": 512, "cores": 2, "kernel": "avx512-fma", "accumulators": 24,
             "flops_per_iter": 768, "fma_gflops_1t": 220.0, "fma_gflops_all": 440.0, "fma_gflops_1t_max": 225.0,
             "fma_gflops_all_max": 450.0, "sgemm_gflops": 300.0, "sgemm_gflops_max": 310.0, "sgemm_n": 2048,
             "sgemm_threads": 2, "measured_at": "2026-11-22T07:09:28+00:00", "target_key": "test",
             "compiler": "cc", "samples": {}}


def _tiny_model(batch: int | str = 1) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    return make_model(nodes, [tensor("x", [batch, 16])], [tensor("y", [batch, 8])], [const("w", w)])


@pytest.fixture
def tiny(tmp_path) -> str:
    path = tmp_path / "tiny.onnx"
    onnx.save(_tiny_model("N"), str(path))
    return str(path)


@pytest.fixture
def no_peak(monkeypatch):
    monkeypatch.setattr(harness, "machine_info", lambda *a, **k: dict(FAKE_MACHINE))


def _numpy_engine(name: str, scale: float = 1.0, calls: list | None = None):
    """A fake peer computing the tiny model with numpy (``scale`` != 1 makes it wrong)."""

    def factory(model: BenchModel, threads: int) -> Runner:
        w = onnx.numpy_helper.to_array(model.proto.graph.initializer[0])

        def run(feeds):
            if calls is not None:
                calls.append(name)
            return [np.maximum(feeds["x"] @ w, 0) * scale]

        return Runner(name, "0", run)

    return factory


def _absent(model: BenchModel, threads: int) -> Runner:
    raise EngineUnavailable("absent is not installed")


def _broken(model: BenchModel, threads: int) -> Runner:
    raise RuntimeError("cannot read this model")


# ----------------------------------------------------------------------------- timing
def test_time_interleaved_gives_each_engine_one_block_per_round_rotating():
    log: list[str] = []
    fns = {n: (lambda n=n: log.append(n)) for n in "abc"}
    times = time_interleaved(fns, rounds=3, warmup=1, block=2, settle=0)
    assert {k: len(v) for k, v in times.items()} == {"a": 6, "b": 6, "c": 6}
    body = log[3:]  # after one warm-up call each
    blocks = [body[i:i + 3] for i in range(0, len(body), 3)]  # 1 untimed + 2 timed calls per block
    assert all(len(set(b)) == 1 for b in blocks), "an engine's block was interrupted by another engine"
    order = [b[0] for b in blocks]
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_settle_waits_for_spinning_threads(monkeypatch):
    """settle_idle returns once the process's threads stop using CPU (a peer engine's workers
    spinning after its calls), not after a fixed time; and at most after ``most``. On a fake
    clock: real spinning threads on a loaded 2-core CI machine got too little CPU to look busy
    (the test once saw a 0.6 s spin as idle after 0.15 s)."""
    import time as real_time

    from smelt.bench import timing

    class Clock:  # wall time advances in sleep(); process CPU time while a fake worker spins
        def __init__(self, spin_until: float) -> None:
            self.now, self.cpu, self.spin_until = 0.0, 0.0, spin_until

        def perf_counter(self) -> float:
            return self.now

        def process_time(self) -> float:
            return self.cpu

        def sleep(self, seconds: float) -> None:
            busy = max(0.0, min(self.now + seconds, self.spin_until) - self.now)
            self.now += seconds
            self.cpu += busy  # one spinning thread: a CPU second per second

    for spin, least, most, lo, hi in ((0.0, 0.0, 0.5, 0.0, 0.03),  # idle already: one slice
                                      (0.15, 0.01, 0.5, 0.15, 0.18),  # waits the spin out
                                      (0.6, 0.01, 0.2, 0.2, 0.22)):  # but never past ``most``
        clock = Clock(spin)
        monkeypatch.setattr(timing, "time", clock)
        timing.settle_idle(least, most=most)
        assert lo <= clock.now <= hi, (spin, least, most, clock.now)
    monkeypatch.setattr(timing, "time", real_time)
    start = real_time.perf_counter()
    timing.settle_idle(0.0)  # the real clock: this process is idle, so it returns at once
    assert real_time.perf_counter() - start < 0.2


def test_time_interleaved_reports_rounds():
    seen = []
    time_interleaved({"a": lambda: None}, rounds=4, warmup=0, block=1, settle=0, on_round=seen.append)
    assert seen == [0, 1, 2, 3]


# ----------------------------------------------------------------------------- checking
def test_relative_error():
    a = [np.array([1.0, -2.0, 4.0], np.float32)]
    assert harness.relative_error(a, a) == 0.0
    assert harness.relative_error(a, [a[0] + np.float32(0.004)]) == pytest.approx(1e-3, rel=1e-3)
    assert harness.relative_error(a, [a[0][:2]]) == math.inf
    assert harness.relative_error(a, [np.array([1.0, np.nan, 4.0])]) == math.inf
    assert harness.relative_error(a, []) == math.inf


def test_mismatch_is_reported_and_not_timed_missing_and_broken_peers_do_not_crash():
    calls: list[str] = []
    factories = {"smelt": ENGINES["smelt"], "good": _numpy_engine("good", calls=calls),
                 "wrong": _numpy_engine("wrong", scale=1.5, calls=calls), "absent": _absent, "broken": _broken}
    model = BenchModel(
        "tiny", _tiny_model(), {"x": np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)})
    entry = harness.bench_model(model, ["good", "wrong", "absent", "broken"], threads=1, rounds=2, warmup=1,
                                block=2, peak_gflops=100.0, factories=factories, progress=False)
    eng = entry["engines"]
    assert eng["smelt"]["status"] == "ok" and eng["good"]["status"] == "ok"
    assert eng["good"]["rel_error"] < 1e-5 and eng["good"]["median_ms"] > 0
    assert eng["wrong"]["status"] == "mismatch" and eng["wrong"]["rel_error"] == pytest.approx(0.5, rel=1e-5)
    assert eng["wrong"]["median_ms"] is None and "not timed" in eng["wrong"]["reason"]
    assert calls.count("wrong") == 1, "a mismatching engine was timed"
    assert calls.count("good") == 1 + 1 + 2 * (1 + 2)  # check, warm-up, 2 rounds of 1 + 2 calls
    assert eng["absent"] == {**eng["absent"], "status": "skipped", "reason": "absent is not installed"}
    assert eng["broken"]["status"] == "error" and "cannot read this model" in eng["broken"]["reason"]
    assert entry["best_peer"] == "good"
    assert entry["speedup_vs_best_peer"] == pytest.approx(eng["good"]["median_ms"] / eng["smelt"]["median_ms"])
    assert entry["flops"] == 2 * 16 * 8
    rep = harness.finish_report(harness.new_report(["smelt", "bench"], FAKE_MACHINE,
                                                   {"threads": 1, "rounds": 2, "warmup": 1, "block": 2,
                                                    "tolerance": 1e-4, "peers": ["good", "wrong"]}))
    rep["models"].append(entry)
    report.validate(harness.finish_report(rep))
    assert "MISMATCH" in report.format_model(entry)


def test_smelt_held_to_an_isa_is_a_variant_not_a_peer_and_its_share_ratio_is_reported():
    """``smelt@avx2`` runs smelt's AVX2 code in the same interleaved run as the default build: it
    ran at its ISA, its share is against that ISA's peak, it is never the "best peer", and the
    summary gives its share over the default build's, per model and as a geomean."""
    from smelt.target import detect

    caps = [c for c in detect().isa_caps() if detect().narrowed(c) != detect()]  # the real caps here
    if not caps:
        pytest.skip("the host runs only one ISA")
    variant = f"smelt@{caps[0]}"
    assert parse_engines(f"ort,{variant}") == ["onnxruntime", variant]
    factories = {"smelt": ENGINES["smelt"], variant: ENGINES[variant], "good": _numpy_engine("good")}
    model = BenchModel(
        "tiny", _tiny_model(), {"x": np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)})
    ran = detect().narrowed(caps[0]).isa  # the cap's vector ISA ("avx2_vnni" runs "avx2")
    peaks = {detect().isa: 100.0, ran: 50.0}
    entry = harness.bench_model(model, [variant, "good"], threads=1, rounds=2, warmup=1, block=2,
                                peak_gflops=peaks, factories=factories, progress=False)
    eng = entry["engines"]
    assert eng[variant]["status"] == "ok" and eng[variant]["isa"] == ran
    assert eng[variant]["details"]["isa_note"].startswith("capped")
    assert entry["best_peer"] == "good"  # not the variant, however fast it was
    rep = harness.new_report([], {**FAKE_MACHINE, "isa": detect().isa, "smelt_isa": detect().isa, "peaks": peaks},
                             {"threads": 1, "rounds": 2, "warmup": 1, "block": 2, "tolerance": 1e-4,
                              "peers": [variant, "good"]})
    rep["models"].append(entry)
    rep = harness.finish_report(rep)
    report.validate(rep)
    ratio = rep["summary"]["isa_share_ratio"][variant]
    expected = eng[variant]["peak_share"] / eng["smelt"]["peak_share"]
    assert ratio["isa"] == caps[0] and ratio["models"] == {"tiny": pytest.approx(expected)}
    assert ratio["geomean"] == pytest.approx(expected) and ratio["min"] == pytest.approx(expected)
    assert f"{variant}: share of the {caps[0]} peak" in report.format_suite(rep)


def test_smelt_held_to_an_isa_the_host_cannot_run_is_skipped_with_the_reason():
    from smelt.target import ISA_CAPS, detect

    missing = [c for c in ISA_CAPS if c not in detect().isa_caps()]
    if not missing:
        pytest.skip("the host runs every ISA smelt has")
    model = BenchModel("tiny", _tiny_model(), {"x": np.zeros((1, 16), np.float32)})
    with pytest.raises(EngineUnavailable, match="cannot run it"):
        ENGINES[f"smelt@{missing[0]}"](model, 1)


def test_smelt_failure_in_a_suite_is_recorded_and_the_run_goes_on(no_peak):
    def smelt_fails(model, threads):
        from smelt.errors import SmeltError

        raise SmeltError("cannot compile tiny")

    factories = {"smelt": smelt_fails, "onnxruntime": ENGINES["onnxruntime"]}
    rep = harness.run_bench(["zoo:lstm-E8-H8-B1-T2"], ["onnxruntime"], 1, rounds=2, factories=factories,
                            progress=False)
    report.validate(rep)
    assert rep["models"][0]["engines"]["smelt"]["status"] == "error"
    assert "cannot compile tiny" in rep["models"][0]["engines"]["smelt"]["reason"]


# ----------------------------------------------------------------------------- the CLI and JSON
def test_cli_bench_json_with_a_missing_peer(tiny, tmp_path, monkeypatch, no_peak, capsys):
    pytest.importorskip("onnxruntime")
    from smelt import cli

    monkeypatch.setitem(sys.modules, "openvino", None)  # importing it now raises ImportError
    out = tmp_path / "r.json"
    rc = cli.main(["bench", tiny, "--against", "onnxruntime,openvino", "--rounds", "2", "--warmup", "1",
                   "--batch", "3", "--threads", "1", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    data = json.loads(out.read_text())
    report.validate(data)
    m = data["models"][0]
    assert m["inputs"] == {"x": [3, 16]} and m["batch"] == 3
    ort = m["engines"]["onnxruntime"]
    assert ort["status"] == "ok" and ort["rel_error"] <= 1e-5
    for key in ("median_ms", "spread_ms", "rel_error", "smelt_speedup", "gflops", "peak_share"):
        assert isinstance(ort[key], float), key
    ov = m["engines"]["openvino"]
    assert ov["status"] == "skipped" and "openvino is not installed" in ov["reason"]
    assert data["command"].startswith("smelt bench")
    assert "SKIPPED" in text and "smelt speedup" in text


def test_schema_rejects_a_report_missing_per_engine_fields():
    entry = {"model": "m", "batch": 1, "inputs": {}, "flops": 0, "threads": 1, "engines":
             {"smelt": {"status": "ok", "median_ms": 1.0}}, "best_peer": None, "speedup_vs_best_peer": None}
    rep = harness.new_report([], FAKE_MACHINE, {"threads": 1, "rounds": 1, "warmup": 0, "block": 1,
                                                "tolerance": 1e-4, "peers": []})
    rep["models"].append(entry)
    with pytest.raises(jsonschema.ValidationError):
        report.validate(harness.finish_report(rep))


def test_unknown_peer_and_bad_arguments_give_clear_errors(tiny, capsys):
    from smelt import cli

    with pytest.raises(ValueError, match="unknown peer engine 'tensorrt'"):
        parse_engines("onnxruntime,tensorrt")
    assert parse_engines("ort, ov,pytorch") == ["onnxruntime", "openvino", "torch"]
    assert cli.main(["bench"]) == 2
    assert "give either MODEL or --suite" in capsys.readouterr().err
    assert cli.main(["bench", "zoo:nonexistent"]) == 2
    assert "unknown zoo model" in capsys.readouterr().err


def test_torch_is_skipped_for_a_model_without_a_torch_definition(tiny):
    pytest.importorskip("torch")
    model = harness.resolve_model(tiny)
    with pytest.raises(EngineUnavailable, match="no PyTorch definition"):
        ENGINES["torch"](model, 1)


# ----------------------------------------------------------------------------- models and suites
def test_resolve_model_fixes_symbolic_batch_and_names_unresolvable_dims(tiny, tmp_path):
    m = harness.resolve_model(tiny, batch=4)
    assert m.feeds["x"].shape == (4, 16) and m.zoo_name is None
    dims = [d.dim_value for d in m.proto.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [4, 16]
    odd = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [1, "L"])], [tensor("y", [1, "L"])])
    path = tmp_path / "odd.onnx"
    onnx.save(odd, str(path))
    from smelt.errors import SmeltError

    with pytest.raises(SmeltError, match="symbolic dimension 'L' at axis 1; give --shape x="):
        harness.resolve_model(str(path))
    assert harness.resolve_model(str(path), shapes={"x": [1, 5]}).feeds["x"].shape == (1, 5)
    r = harness.resolve_model("zoo:lstm-E8-H8-B2-T3")
    assert r.zoo_name == "lstm-e8-h8-b2-t3" and harness._batch_of(r) == 2


def test_suites():
    assert suite_models("cnn") == list(CNN_SUITE) and len(CNN_SUITE) == 7
    names = rnn_suite()
    assert len(names) == 30 and sum(n.startswith("gru") for n in names) == 15
    assert all(zoo.parse_rnn_name(n) is not None for n in names)
    with pytest.raises(ValueError, match="unknown suite 'nlp'"):
        suite_models("nlp")


# ----------------------------------------------------------------------------- charts, throughput
def test_charts_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    factories = {"smelt": ENGINES["smelt"], "good": _numpy_engine("good")}
    model = BenchModel("tiny", _tiny_model(), {"x": np.ones((1, 16), np.float32)})
    entry = harness.bench_model(model, ["good"], 1, rounds=2, warmup=0, block=1, factories=factories,
                                progress=False)
    rep = harness.new_report([], FAKE_MACHINE, {"threads": 1, "rounds": 2, "warmup": 0, "block": 1,
                                                "tolerance": 1e-4, "peers": ["good"]})
    rep["models"] += [entry, {**entry, "model": "tiny2"}]
    harness.finish_report(rep)
    report.write_speedup_chart(rep, tmp_path / "suite.png")
    report.write_latency_chart(entry, tmp_path / "one.png")
    for name in ("suite.png", "one.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "geomean" in report.format_suite(rep) and report.format_suite(rep, markdown=True).startswith("| model")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_throughput_runs_instances_on_disjoint_cores():
    pytest.importorskip("onnxruntime")
    from smelt.bench.throughput import core_sets, measure_throughput
    from smelt.errors import SmeltError

    with pytest.raises(SmeltError, match="only 2 physical cores"):
        core_sets(3, 1, cpus=[0, 1])
    assert core_sets(2, 1, cpus=[4, 6]) == [[4], [6]]
    model = BenchModel("tiny", _tiny_model(), {"x": np.ones((1, 16), np.float32)})
    res = measure_throughput(model, ["smelt", "onnxruntime"], 2, 1, duration=0.2, rounds=1, progress=False)
    for engine in ("smelt", "onnxruntime"):
        r = res[engine]
        assert r["instances"] == 2 and r["calls"] > 0 and r["items_per_s"] > 0
        assert r["latency_max_ms"] >= r["latency_median_ms"] > 0
        assert sorted(c for cpus in r["cpus"] for c in cpus) == sorted(set(c for cpus in r["cpus"] for c in cpus))
        jsonschema.validate(r, report.THROUGHPUT_SCHEMA)


def test_cli_info_peak_prints_the_measured_peak(monkeypatch, capsys):
    from smelt import cli
    from smelt.bench import peak

    calls = []

    def fake(measure=None, progress=True, **kw):
        calls.append(measure)
        return peak.PeakResult.from_dict(FAKE_PEAK)

    monkeypatch.setattr(peak, "load_or_measure_peak", fake)
    assert cli.main(["info", "--peak"]) == 0
    out = capsys.readouterr().out
    assert calls == [True] and "GFLOPS" in out and "cache dir" in out


def test_cli_profile_writes_table_html_and_json(tiny, tmp_path, monkeypatch, capsys):
    from smelt import cli
    from smelt.bench import peak

    monkeypatch.setattr(peak, "peak_or_reason",
                        lambda measure=None, progress=True, **kw: (peak.PeakResult.from_dict(FAKE_PEAK), "test peak"))
    out_json, out_html = tmp_path / "p.json", tmp_path / "p.html"
    assert cli.main(["profile", tiny, "--batch", "2", "--rounds", "3", "--threads", "1",
                     "--json", str(out_json), "--html", str(out_html)]) == 0
    text = capsys.readouterr().out
    assert "mm" in text and "Relu" in text and "sum of node times" in text  # relu fused into mm
    data = json.loads(out_json.read_text())
    assert data["model"] == "tiny" and len(data["nodes"]) >= 1
    assert "<html" in out_html.read_text().lower()


# ----------------------------------------------------------------------------- ISA and machine
def test_apply_isa_cap_sets_smelt_and_peer_variables(monkeypatch):
    from smelt.target import detect

    host = detect()
    for var in ("SMELT_ISA", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY",
                "MKL_ENABLE_INSTRUCTIONS"):
        monkeypatch.setenv(var, "")  # so that teardown removes what apply_isa_cap sets
        monkeypatch.delenv(var)
    assert harness.apply_isa_cap(None) == {} and harness.apply_isa_cap("native") == {}
    if host.narrowed(host.isa) == host:  # the host's own ISA is no cap (unless it drops a feature)
        assert harness.apply_isa_cap(host.isa) == {}
    if "avx2" in host.isa_caps() and host.narrowed("avx2") != host:
        env = harness.apply_isa_cap("avx2")
        assert env == {"SMELT_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2",
                       "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
        assert all(__import__("os").environ[k] == v for k, v in env.items())
    if "avx2_vnni" in host.isa_caps() and host.narrowed("avx2_vnni") != host:
        env = harness.apply_isa_cap("avx2_vnni")  # the cap's name, not the vector ISA it runs
        assert env["SMELT_ISA"] == "avx2_vnni" and env["ONEDNN_MAX_CPU_ISA"] == "AVX2_VNNI", env
    env = harness.apply_isa_cap("scalar")
    assert env["ATEN_CPU_CAPABILITY"] == "default" and env["ONEDNN_MAX_CPU_ISA"] == "SSE41"
    with pytest.raises(ValueError, match="must be one of"):
        harness.apply_isa_cap("avx9000")


def test_isa_named_in_peer_kernel_names():
    from smelt.target import isa_named_in

    assert isa_named_in(["brgconv_avx512_f32", "reorder_f32"]) == "avx512"
    assert isa_named_in(["brgconv_avx2_f32", "jit_uni_f32"]) == "avx2"
    assert isa_named_in("AVX2") == "avx2" and isa_named_in("AVX512") == "avx512"
    assert isa_named_in("DEFAULT") == "scalar"
    assert isa_named_in(["jit_uni_f32", "ref_any"]) is None


def test_machine_info_names_the_cpu_and_has_a_peak_per_isa(monkeypatch):
    from smelt.bench import peak
    from smelt.target import detect

    host = detect()
    asked = []

    def fake(measure=None, progress=True, isa=None):
        asked.append(isa)
        return peak.PeakResult.from_dict({**FAKE_PEAK, "isa": isa, "fma_gflops_1t_max": 10.0 * len(asked)}), "x"

    monkeypatch.setattr(peak, "peak_or_reason", fake)
    low = host.isa_caps()[-1]
    info = harness.machine_info(1, progress=False, isa=low)
    assert info["cpu"] == host.cpu and info["isa"] == host.isa and info["smelt_isa"] == low
    assert info["cpu_family"] == host.cpu_family and info["caches"]["l2_kib"] == host.l2_bytes // 1024
    assert list(info["peaks"]) == list(dict.fromkeys([low, host.isa]))
    assert info["peak_gflops"] == info["peaks"][low] == 10.0


def test_share_of_peak_is_per_engine_isa_and_counts_winograd_as_executed():
    model = BenchModel("m", _tiny_model(), {"x": np.zeros((1, 16), np.float32)})
    results = {"smelt": {"status": "ok", "details": {"isa": "avx2", "executed_flops": 4_000_000}},
               "peer": {"status": "ok", "details": {"isa": "avx512"}},
               "unknown": {"status": "ok", "details": {}}}
    samples = {"smelt": [1.0, 1.0], "peer": [1.0, 1.0], "unknown": [1.0, 1.0]}  # ms
    entry = harness.summarize(model, results, samples, 1, {"avx2": 10.0, "avx512": 20.0}, 9_000_000, 1, 1)
    e = entry["engines"]
    assert e["smelt"]["gflops"] == pytest.approx(9.0) and e["smelt"]["executed_gflops"] == pytest.approx(4.0)
    assert e["smelt"]["peak_share"] == pytest.approx(0.4)  # 4 executed GFLOPS of avx2's 10
    assert e["peer"]["peak_share"] == pytest.approx(9.0 / 20.0)  # nominal, of avx512's 20
    assert e["unknown"]["peak_share"] is None  # no ISA: no share rather than a wrong one
    assert e["smelt"]["isa"] == "avx2"


def test_executed_flops_of_a_winograd_step():
    from smelt.bench.engines import step_executed_flops

    wino = {"algorithm": "Winograd F(2x2,3x3), NCHW16c"}
    assert step_executed_flops(36_000, wino) == 16_000
    assert step_executed_flops(36_000, {"algorithm": "direct convolution, NCHW[x]c (NeoCPU)"}) == 36_000
    assert step_executed_flops(36_000, {}) == 36_000


def test_executed_flops_count_a_multi_step_node_once():
    """A phased Winograd conv is three steps each carrying the node's FLOPs (StepInfo): the model's
    executed FLOPs count it once (they counted it three times: VGG-16 at "191% of peak")."""
    from types import SimpleNamespace

    from smelt.bench.engines import executed_flops
    from smelt.runtime.artifact import StepInfo

    wino = {"algorithm": "Winograd F(2x2,3x3), NCHW16c"}
    steps = [StepInfo("c1", "Conv", k, 3, 36_000, (), wino) for k in range(3)]
    steps.append(StepInfo("c2", "Conv", 0, 1, 1_000, (), {"algorithm": "direct"}))
    plan = SimpleNamespace(native_blocks=[SimpleNamespace(step_info=steps)], fallback_steps=[])
    assert executed_flops(plan) == 16_000 + 1_000


def test_report_names_cpu_isas_and_caches(tiny, tmp_path, monkeypatch, capsys):
    """`smelt bench` output and JSON name the CPU, the caches and the ISA each engine ran."""
    from smelt import cli

    machine = {**FAKE_MACHINE, "cpu": "AMD EPYC (family 25 model 17)"}
    monkeypatch.setattr(harness, "machine_info", lambda *a, **k: dict(machine))
    out = tmp_path / "r.json"
    assert cli.main(["bench", tiny, "--against", "onnxruntime", "--rounds", "2", "--warmup", "1",
                     "--threads", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "cpu: AMD EPYC (family 25 model 17)" in text and "L2 1024 KiB" in text
    assert "isa: host avx512" in text and "onnxruntime" in text and "cannot be capped" in text
    data = json.loads(out.read_text())
    report.validate(data)
    eng = data["models"][0]["engines"]
    from smelt.target import detect

    assert eng["smelt"]["details"]["isa"] == detect().isa == eng["smelt"]["isa"]
    if eng["onnxruntime"]["status"] == "ok":
        assert eng["onnxruntime"]["details"]["isa_note"] == "native ISA (cannot be capped)"
    assert data["machine"]["caches"] and data["machine"]["cpu"].startswith("AMD EPYC")


def test_cli_info_names_family_model_and_measures_the_isa_asked(monkeypatch, capsys):
    from smelt import cli
    from smelt.bench import peak
    from smelt.target import detect

    asked = []

    def fake(measure=None, progress=True, isa=None, **kw):
        asked.append(isa)
        return peak.PeakResult.from_dict(FAKE_PEAK)

    monkeypatch.setattr(peak, "load_or_measure_peak", fake)
    low = detect().isa_caps()[-1]
    assert cli.main(["info", "--peak", "--isa", low]) == 0
    out = capsys.readouterr().out
    assert asked == [low] and f"cpu:        {detect().cpu}" in out and "can cap it to" in out


def test_format_machine_flags_a_share_above_the_peak():
    entry = {"model": "m", "engines": {"smelt": {"status": "ok", "peak_share": 1.13, "details": {"isa": "avx2"}},
                                       "onnxruntime": {"status": "ok", "peak_share": 0.5,
                                                       "details": {"isa": "avx512", "isa_note": "native"}}}}
    rep = {"machine": {**FAKE_MACHINE, "peak_notes": {"avx512": "measured at load average 9"}},
           "settings": {"threads": 2, "isa": "avx2"}, "models": [entry]}
    text = report.format_machine(rep)
    assert "capped to avx2" in text and "smelt avx2" in text and "onnxruntime avx512 (native)" in text
    assert "smelt above 100% of peak" in text and "onnxruntime above" not in text
    assert "avx512 peak measured at load average 9" in text
    assert "fp32 FMA peak at 2 threads: avx512 100.0 GFLOPS" in text
