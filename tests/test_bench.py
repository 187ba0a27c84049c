"""bench/planner.py and bench/torchrec_estimator.py end to end on their smallest case: they
print their figures and write them as JSON (the planner bench also as a chart); bench/charts.py
redraws charts from kept results; every bench rejects bad arguments before it runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import forked
from tests.conftest import ROOT, subprocess_env

PNG = b"\x89PNG\r\n\x1a\n"
COLUMNS = ("neo/tr", "neo128/tr", "neo[TR]/tr", "neo/LB", "neo[TR]/LB", "tr/LB", "speedup")


def test_planner_bench_prints_and_writes_the_ratios(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "bench/planner.py", "--suites", "mlperf_dcnv2", "--ranks", "8",
         "--repeats", "1", "--out", str(out)],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    header, line = proc.stdout.splitlines()[:2]
    assert all(column in header for column in COLUMNS), header
    assert line.split()[:2] == ["mlperf_dcnv2", "8"], line
    [row] = json.loads(out.read_text())
    tr = row["torchrec"]
    assert "score_ms" in tr and not tr["timed_out"], tr  # TorchRec finishes on 26 tables in seconds
    # Neo timed before TorchRec's run and as often after it: its time is the fastest of both
    assert len(row["neo"]["times_s"]) == 2 and row["neo"]["time_s"] == min(row["neo"]["times_s"])
    assert row["speedup"] == tr["plan_s"] / row["neo"]["time_s"]
    # TorchRec's plan is kept (to be scored again under a changed cost model: --rescore)
    assert sorted(a["name"] for a in tr["plan"]) == sorted(f"cat_{i}" for i in range(26)) and "neo_model_step_ms" in tr
    table_lines = [line for line in out.read_text().splitlines() if '"name": "cat_' in line]
    assert len(table_lines) == 26 and all(line.strip().endswith(("},", "}")) for line in table_lines)  # one line a table
    # the ratios are what they say: plans scored by TorchRec's estimator, over TorchRec's plan
    assert row["neo_over_torchrec"] == row["neo"]["torchrec_score_ms"] / tr["score_ms"]
    # neither Neo plan is worse than TorchRec's under TorchRec's own estimator
    assert row["neo_over_torchrec"] <= 1.0 and row["neo_tr_est_over_torchrec"] <= 1.0, row
    # Neo held to TorchRec's column options (no column shard under 128 columns), scored by
    # TorchRec's estimator too, and printed in its column
    narrow = row["neo_cw128"]
    assert row["neo_cw128_over_torchrec"] == narrow["torchrec_score_ms"] / tr["score_ms"], row
    assert f"{row['neo_cw128_over_torchrec']:.3f}" in line.split(), line
    # bounds are bounds: nothing below them, Neo within 1.10x of its own
    assert 1.0 <= row["neo"]["vs_bound"] <= 1.10, row["neo"]
    assert row["neo_torchrec_estimator"]["vs_bound"] >= 1.0 and row["torchrec_vs_bound"] >= 1.0, row
    # the progress bar goes to stderr, leaving stdout to the table
    assert "planner bench" in proc.stderr
    # and the chart beside the JSON
    assert out.with_suffix(".png").read_bytes()[:8] == PNG and str(out.with_suffix(".png")) in proc.stderr


def test_planner_bench_rescores_a_kept_result_without_running_torchrec(tmp_path):
    """--rescore: Neo plans the kept cases again; the TorchRec plan, its score and time are the
    kept ones, and the ratios are recomputed against them."""
    kept = [r for r in json.loads((ROOT / "docs/results/bench_planner.json").read_text())
            if r["suite"] == "mlperf_dcnv2" and r["ranks"] == 8]
    kept[0]["torchrec"]["score_ms"] *= 2.0  # a TorchRec plan twice as slow: Neo's ratio halves
    # a result kept without TorchRec's plan (as before plans were kept; the full runs keep it)
    kept[0]["torchrec"].pop("plan", None)
    path = tmp_path / "kept.json"
    path.write_text(json.dumps(kept))
    proc = forked.run("bench/planner.py", "--rescore", str(path), "--repeats", "1", env=subprocess_env(),
                      timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = json.loads(path.read_text())  # written back to the kept file
    # without TorchRec's plan, its score under Neo's (possibly changed) model is left out
    assert row["torchrec"] == {k: v for k, v in kept[0]["torchrec"].items() if k != "neo_model_step_ms"}
    assert row["neo_over_torchrec"] == row["neo"]["torchrec_score_ms"] / kept[0]["torchrec"]["score_ms"] < 0.5
    assert "neo_tr_est_over_torchrec" in row and row["speedup"] == kept[0]["torchrec"]["plan_s"] / row["neo"]["time_s"]
    assert "neo_over_torchrec_neo_model" not in row
    # with the plan kept, it is scored again under the current model (here: Neo's own plan stands in)
    kept[0]["torchrec"]["plan"] = [
        {"name": a["name"], "sharding_type": a["sharding_type"], "compute_kernel": a["compute_kernel"],
         "ranks": a["ranks"], "shard_shapes": a["shard_shapes"]} for a in _neo_plan_mlperf_8()]
    path.write_text(json.dumps(kept))
    proc = forked.run("bench/planner.py", "--rescore", str(path), "--repeats", "1", env=subprocess_env(),
                      timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = json.loads(path.read_text())
    assert row["neo_over_torchrec_neo_model"] == pytest.approx(1.0)  # the same plan both ways
    assert row["torchrec"]["neo_model_step_ms"] == pytest.approx(row["neo"]["step_ms"])


def _neo_plan_mlperf_8() -> list[dict]:
    """Neo's plan of MLPerf on 8 ranks, as the bench plans it (its tables' assignments)."""
    import dataclasses

    sys.path.insert(0, str(ROOT / "bench"))
    from planner import SUITES, _context

    from neo_plugins.sharding.planner import NeoPlanner

    gen, extra = SUITES["mlperf_dcnv2"]
    result = NeoPlanner().plan(gen(), _context(8, extra))
    return [dataclasses.asdict(a) for a in result.tables]


@pytest.mark.parametrize(
    "result", ["bench_planner.json", "bench_train.json", "fidelity_latest.json", "bench_gpu_lookup.json"])
def test_charts_are_drawn_from_kept_results(result, tmp_path):
    import matplotlib.image

    out = tmp_path / "charts" / "chart.png"  # a folder not there yet is made
    proc = forked.run("bench/charts.py", f"docs/results/{result}", "--out", str(out), env=subprocess_env(),
                      timeout=120, cold=result == "bench_planner.json")  # once as a fresh interpreter runs it
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == PNG and f"wrote {out}" in proc.stdout
    height, width = matplotlib.image.imread(out).shape[:2]
    assert width >= 600 and height >= 400, (width, height)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "cannot be read"),
        ("{not json", "not JSON"),
        ('{"rows": []}', "not a result of bench/planner.py"),
    ],
    ids=["missing", "not-json", "other-json"],
)
def test_charts_reject_what_no_bench_wrote(content, fragment, tmp_path):
    source = tmp_path / "result.json"
    if content is not None:
        source.write_text(content)
    proc = forked.run("bench/charts.py", str(source), env=subprocess_env(), timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{source}: {fragment}" in proc.stderr.splitlines()[-1], proc.stderr
    assert not source.with_suffix(".png").exists()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--ranks", "12"), "--ranks 12: use 1 to 8 ranks (one node) or a multiple of 8"),
        (("--ranks", "0"), "--ranks 0:"),
        (("--torchrec-timeout", "-5"), "--torchrec-timeout -5.0: must be 0 (none) or more seconds"),
        (("--torchrec-kill", "0"), "--torchrec-kill 0.0: must be more than 0 seconds"),
        (("--no-torchrec", "--torchrec-cached"), "--no-torchrec runs no TorchRec planner"),
        (("--ranks", "8", "8"), "--ranks names 8 twice; each case runs once"),
        (("--rescore", "{file}.missing"), "no such file"),
        (("--repeats", "0"), "--repeats 0: must be at least 1"),
        (("--out", "{file}/bench.json"), "/file/bench.json: cannot be written"),
        (("--rescore", "{file}"), "not a result of this bench (a JSON list of cases)"),
        (("--rescore", "{zero}"), "a case of ranks 0: use 1 to 8 ranks"),
        (("--rescore", "{kept}", "--ranks", "8"), "takes its cases from"),
    ],
    ids=["ranks-not-nodes-of-8", "ranks-zero", "negative-timeout", "zero-kill", "no-torchrec-cached", "ranks-twice",
         "rescore-missing", "no-repeats", "unwritable-out", "rescore-other",
         "rescore-zero-ranks", "rescore-and-ranks"],
)
def test_planner_bench_rejects_bad_arguments_before_planning(args, fragment, tmp_path):
    # a rank count that is no whole number of 8-rank nodes would plan another cluster than the
    # row says; an unwritable --out (here: under a file) would fail only after the first case
    (tmp_path / "file").write_text("")
    (tmp_path / "zero.json").write_text('[{"suite": "mlperf_dcnv2", "ranks": 0}]')
    (tmp_path / "kept.json").write_text('[{"suite": "mlperf_dcnv2", "ranks": 8}]')
    args = [a.format(file=tmp_path / "file", zero=tmp_path / "zero.json", kept=tmp_path / "kept.json") for a in args]
    suites = [] if "--rescore" in args else ["--suites", "mlperf_dcnv2"]
    proc = forked.run("bench/planner.py", *suites, *args, env=subprocess_env(), timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert fragment in proc.stderr.splitlines()[-1], proc.stderr
    assert "planner bench" not in proc.stderr  # no case started


def test_torchrec_estimator_bench_times_both_ways(tmp_path):
    out = tmp_path / "est.json"
    proc = forked.run("bench/torchrec_estimator.py", "--suites", "mlperf_dcnv2", "--ranks", "8", "--json", str(out),
                      env=subprocess_env(), timeout=300, cold=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].split()[:2] == ["mlperf_dcnv2", "8"], proc.stdout
    [row] = json.loads(out.read_text())  # the bench exits with an error if the plans differ
    assert row["as_is_s"] > 0 and row["quick_s"] > 0
    assert row["ratio"] == row["as_is_s"] / row["quick_s"]
    bad = forked.run("bench/torchrec_estimator.py", "--ranks", "12", env=subprocess_env(), timeout=120)
    assert bad.returncode == 2 and "--ranks 12: use 1 to 8 ranks" in bad.stderr, bad.stderr


@pytest.mark.parametrize(
    ("script", "args", "fragment"),
    [
        ("bench/train.py", ["--steps", "0"], "--steps 0: must be at least 6"),
        ("bench/train.py", ["--keep", "tests"], "--keep tests: the folder is not empty; give a new folder"),
        ("bench/train.py", ["--keep", "README.md"], "--keep README.md: a file; give a new folder"),
        ("bench/train.py", ["--json", "{file}/x.json"], "/file/x.json: cannot be written (its folder"),
        ("bench/fidelity.py", ["--rounds", "0"], "--rounds 0: must be at least 1"),
        ("bench/fidelity.py", ["--quantile", "1.5"], "--quantile 1.5: must lie in [0, 1]"),
        ("bench/fidelity.py", ["--nice", "-3"], "--nice -3: give how far above normal priority, 0 or more"),
        ("bench/fidelity.py", ["--calibration", "/no/such.json"], "--calibration /no/such.json: not a file; write one with"),
        ("bench/flag_broadcast.py", ["--calls", "0"], "--calls 0 must be at least 1"),
        ("bench/alltoall_share.py", ["--mib", "0"], "--mib 0: must be at least 1"),
        ("bench/input_dist.py", ["--dim", "0"], "--dim 0: must be at least 1"),
        ("bench/alltoall_share.py", ["--json", "{file}/x.json"], "/file/x.json: cannot be written (its folder"),
        ("bench/torchrec_estimator.py", ["--json", "{file}/x.json"], "/file/x.json: cannot be written (its folder"),
        ("bench/fidelity.py", ["--json", "{tmp}"], "a folder; give a file name in it"),
        ("bench/gpu_lookup.py", [], "give --raw FILE (measure) or --report FILE"),
        ("bench/gpu_lookup.py", ["--raw", "x.json", "--dtypes", "bf16"], "--dtypes takes fp32 and fp16"),
        ("bench/gpu_lookup.py", ["--raw", "x.json"], "no CUDA device here"),
    ],
)
def test_training_and_fidelity_benches_reject_bad_arguments_before_any_run(script, args, fragment, tmp_path):
    (tmp_path / "file").write_text("")  # a results folder under a file cannot be made
    args = [a.format(file=tmp_path / "file", tmp=tmp_path) for a in args]
    proc = forked.run(script, *args, env=subprocess_env(), timeout=120)
    assert proc.returncode == 2 and fragment in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_gpu_lookup_bench_measures_on_cpu_and_costs_with_both_models(tmp_path):
    """The measuring half runs anywhere (here a small CPU check); the report costs each case
    with Neo's formula and TorchRec's estimator on the measured bandwidths."""
    raw, out = tmp_path / "raw.json", tmp_path / "report.json"
    proc = forked.run("bench/gpu_lookup.py", "--raw", str(raw), "--device", "cpu", "--rows", "5000", "--batch", "64",
                      "--reps", "1", "--dtypes", "fp32,fp16", "--json", str(out), env=subprocess_env(), timeout=300,
                      cold=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert len(data["cases"]) == 2 * 5 * 3 and data["device_memory_bw"] > 0
    assert all(c["seconds"] > 0 and c["predicted_s"] > 0 and c["torchrec_predicted_s"] > 0 for c in data["cases"])
    assert set(data["summary"]) == {"device fp32", "device fp16"} and "measured/Neo median" in proc.stdout
    assert out.with_suffix(".png").read_bytes()[:8] == PNG


def test_gpu_lookup_report_uses_the_planners_formula():
    """Two kept H200 cases worked by hand: forward bytes n (ib + rb) + m c ob over the measured
    device bandwidth, 128 columns with no penalty, 64 columns with 1.15."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_lookup import report

    raw = json.loads((ROOT / "docs/results/bench_gpu_lookup_raw.json").read_text())
    cases = {(c["place"], c["dtype"], c["dim"], c["pooling"]): c for c in report(raw)["cases"]}
    M, n, m = raw["device_memory_bw"], 65_536 * 8, 65_536
    assert cases["device", "fp32", 128, 8]["predicted_s"] == pytest.approx((n * (8 + 512) + m * 128 * 4) / M)
    assert cases["device", "fp32", 64, 8]["predicted_s"] == pytest.approx(1.15 * (n * (8 + 256) + m * 64 * 4) / M)
    # rows in host memory are cache misses: each row's bytes cross the bus and are written to the
    # device; the ids and the pooled rows are device memory
    H = raw["host_to_device_bw"]
    expected = (n * 8 + m * 256 * 4) / M + n * 1024 * (1 / H + 1 / M)
    assert cases["host", "fp32", 256, 8]["predicted_s"] == pytest.approx(expected, rel=1e-6)


def test_fidelity_bench_costs_every_plan_with_both_models():
    """bench/fidelity.py checks Neo's cost model against measured steps and, for comparison,
    TorchRec's estimator on the same topology: both cost every plan, and both see that one
    rank holding every table is about twice as slow as the tables split evenly over two."""
    sys.path.insert(0, str(ROOT / "bench"))
    import fidelity

    results = fidelity.every_plan(None, ["none", "fp16"])
    torchrec = fidelity.torchrec_predictions(results)
    assert set(torchrec) == set(results) and all(t > 0 for t in torchrec.values()), torchrec
    neo = {name: r.predicted_step_time for name, (r, _) in results.items()}
    for model in (neo, torchrec):
        assert 1.5 < model["TW on rank 0"] / model["TW balanced"] <= 2.0, model
    # the plans that send pooled embeddings also run compressed, each with its compressor's context
    assert {n for n in results if n.endswith(" fp16")} == {f"{n} fp16" for n in fidelity.COMPRESSED}
    assert {ctx.compressor.name for name, (_, ctx) in results.items() if name.endswith(" fp16")} == {"fp16"}
    # on the assumed CPU figures the codec (2 GB/s) costs more than fp16 saves on the wire (1 GB/s)
    assert results["TW balanced fp16"][0].predicted_step_time > results["TW balanced"][0].predicted_step_time


def test_fidelity_bench_measures_the_model_it_is_told():
    # --model comm: wide rows, one id a sample, so that the all-to-alls are most of a step
    sys.path.insert(0, str(ROOT / "bench"))
    import fidelity

    try:
        fidelity.use_model("comm")
        assert [(t.name, t.num_embeddings, t.embedding_dim, t.pooling_factor) for t in fidelity.specs()] == [
            (n, r, d, float(p)) for n, (r, d, p) in fidelity.MODELS["comm"].items()]
        assert {t.pooling_factor for t in fidelity.specs()} == {1.0}
    finally:
        fidelity.use_model("lookup")
    assert {t.pooling_factor for t in fidelity.specs()} == {32.0, 4.0}


def test_fidelity_bench_says_what_compression_changes_measured_and_predicted():
    sys.path.insert(0, str(ROOT / "bench"))
    import fidelity

    rows = [{"plan": p, "measured_s": m, "predicted_s": q} for p, m, q in (
        ("TW balanced", 0.010, 0.008), ("TW balanced fp16", 0.012, 0.0084), ("RW large, DP small", 0.05, 0.05),
        ("RW", 0.02, 0.02), ("RW bf16", 0.018, 0.017))]
    assert fidelity.compression_ratios(rows) == [
        {"plan": "TW balanced fp16", "measured": pytest.approx(1.2), "predicted": pytest.approx(1.05)},
        {"plan": "RW bf16", "measured": pytest.approx(0.9), "predicted": pytest.approx(0.85)},
    ]


def test_alltoall_share_bench_times_every_share(tmp_path):
    out = tmp_path / "results" / "share.json"  # a folder not there yet is made before the run
    proc = forked.run("bench/alltoall_share.py", "--mib", "1", "--repeats", "1", "--json", str(out),
                      env=subprocess_env(), timeout=120, cold=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # each rank checks that what it kept is its own and what crossed is the other's (else it fails)
    rows = json.loads(out.read_text())["rows"]
    assert [r["share_kept"] for r in rows] == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_gloo_precisions_bench_times_each_collective_in_each_precision(tmp_path):
    out = tmp_path / "precisions.json"
    proc = forked.run("bench/gloo_precisions.py", "--mib", "1", "--repeats", "1", "--json", str(out),
                      env=subprocess_env(), timeout=120, cold=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # each rank checks its reduce-scatter summed both ranks' values in every precision (else it fails)
    rows = json.loads(out.read_text())["rows"]
    assert {(r["precision"], r["collective"]) for r in rows} == {
        (p, c) for p in ("fp32", "fp16", "bf16") for c in ("reduce-scatter", "all-to-all")}
    assert all(r["over_fp32"] == 1.0 for r in rows if r["precision"] == "fp32")


def test_input_dist_bench_times_ids_and_pooled_rows(tmp_path):
    out = tmp_path / "ids.json"
    proc = forked.run("bench/input_dist.py", "--batch", "64", "--repeats", "1", "--json", str(out),
                      env=subprocess_env(), timeout=120, cold=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # each rank checks it received every id of the feature it owns (else it fails)
    rows = json.loads(out.read_text())["rows"]
    assert [r["pooling"] for r in rows] == [1, 8, 32, 128]


def test_the_training_bench_records_each_plan_and_the_calibration_behind_it(tmp_path) -> None:
    # a calibration of this machine changes Neo's plans (TW 26 -> DP 6, TW 20) and so the
    # throughput, and the results said neither
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("bench_train", ROOT / "bench" / "train.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # type: ignore[union-attr]
    (tmp_path / "plan.json").write_text(json.dumps({
        "notes": ["kernel fused", "types: DP 6, TW 20"],
        "topology": {"sources": {"intra_node_bw": "measured (/x/cal.json)", "device_memory": "assumed"}}}))
    assert bench.plan_of(tmp_path) == {"plan": "DP 6, TW 20", "calibration": "measured (/x/cal.json)"}
    said = "/x/cal.json (2026-12-01), collectives measured with 2 ranks"  # the topology's own entry, when it has one
    (tmp_path / "plan.json").write_text(json.dumps({
        "notes": ["types: DP 6, TW 20"],
        "topology": {"sources": {"intra_node_bw": "measured (/x/cal.json)", "calibration": said}}}))
    assert bench.plan_of(tmp_path)["calibration"] == said
    (tmp_path / "plan.json").write_text(json.dumps({"notes": ["types: TW 26"], "topology": {}}))
    assert bench.plan_of(tmp_path) == {"plan": "TW 26", "calibration": None}


def _large_result(suite, world, timeout, queue) -> None:
    queue.put({"plan": "x" * 1_000_000, "time_s": 0.0})  # more than a pipe's buffer holds


def test_a_torchrec_child_with_a_large_result_is_read_not_waited_out(monkeypatch) -> None:
    # TorchRec's plan of 500 tables on 16 ranks is about 150 KB: its child could not exit until
    # the result was read, and the bench joined it first, so a finished run was "killed after 600 s"
    import time

    sys.path.insert(0, str(ROOT / "bench"))
    import planner

    monkeypatch.setattr(planner, "_torchrec_child", _large_result)
    start = time.monotonic()
    out = planner.run_torchrec("mlperf_dcnv2", 8, 60.0, kill_after=60.0)
    assert len(out["plan"]) == 1_000_000 and time.monotonic() - start < 30  # not the 60 s kill


def test_capacity_settings_bench_plans_with_every_checked_setting(tmp_path):
    out = tmp_path / "settings.json"
    proc = forked.run("bench/capacity_settings.py", "--seeds", "0", "12", "--json", str(out), env=subprocess_env(),
                      timeout=300, cold=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    counts = result["counts"]
    assert counts["cases"] == 12 and counts["refused"] > 0 and counts["checked settings named"] > 0, counts
    assert counts["settings that plan"] == counts["checked settings named"] and result["failures"] == []
    assert "settings that plan" in proc.stdout


def test_planner_ab_compares_a_revision_with_the_working_tree(tmp_path):
    # dada775 plans before the fewer-types pass re-placed tables: on this random cluster (MLPerf
    # on 64 nodes of 8 GPUs) the working tree's plan is better; each side plans with its own code
    out = tmp_path / "ab.json"
    proc = forked.run("bench/planner_ab.py", "--base", "dada775", "--rounds", "1", "--cases", "random",
                      "--seeds", "13", "14", "--out", str(out), env=subprocess_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    [row] = json.loads(out.read_text())["rows"]
    assert row["case"] == "random 13" and row["change"].startswith("better"), row
    assert row["head_step_s"] < 0.97 * row["base_step_s"]
    assert "plans: 1 better, 0 worse" in proc.stdout
    bad = forked.run("bench/planner_ab.py", "--base", "no-such-rev", env=subprocess_env(), timeout=60)
    assert bad.returncode == 2 and "--base no-such-rev: not a revision of this repository" in bad.stderr
