"""Lookup cost on a GPU: measured embedding-bag forward times against Neo's lookup formula.

    python bench/gpu_lookup.py --raw raw.json                  # on a CUDA machine: measure
    .venv/bin/python bench/gpu_lookup.py --report raw.json --json docs/results/bench_gpu_lookup.json

Measuring needs only PyTorch with CUDA (and CuPy, for rows in host memory), so it runs where
Neo is not installed; the report costs every case with Neo's own formula
(``CostModel._lookup``, the figure the planner uses for a shard's forward lookup) on a
topology whose two bandwidths are the ones measured here, and compares. Both steps at once
where Neo and CUDA are both present: ``--raw raw.json --json out.json``.

Measured, on one GPU (one process, CUDA events, the median of ``--reps`` timed runs after two
warm-ups):
- ``device_memory_bw``: a device-to-device copy of 1 GiB, read and written bytes counted (the
  model's ``M``).
- ``host_to_device_bw``: a copy of 1 GiB of pinned host memory to the device (the model's
  ``H``).
- per case (rows in device memory, or in pinned host memory read by the GPU directly, the
  traffic of a cache miss), embedding dimension and pooling factor: ``F.embedding_bag`` (sum)
  of ``--batch`` bags of uniform random ids into a table of ``--rows`` rows, fp32 weights,
  int64 ids.

PyTorch's embedding-bag kernel is not FBGEMM's table-batched kernel that training uses on
GPUs (which this machine cannot load); the comparison checks the formula's bytes-over-
bandwidth form, the 32-column minimum read and the narrow-row penalty it takes from
TorchRec's estimator, and the cost of reading rows from host memory, not FBGEMM's kernel.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

DIMS = (16, 32, 64, 128, 256)
WEIGHT_BYTES = {"fp32": 4, "fp16": 2}
# TorchRec's estimator: a data-parallel table's optimizer step is 9.22 passes over its bytes
# (DP_ELEMENTWISE_KERNELS_PERF_FACTOR) at half the device bandwidth, whatever the optimizer
TORCHREC_DP_PASSES = 9.22 / 0.5
POOLING = (1, 8, 32)
GiB = 2**30


def _timed(fn: Any, reps: int, device: str) -> float:
    """Median seconds of ``fn()`` over ``reps`` runs after two warm-ups."""
    import torch

    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _host_mapped(rows: int, dim: int, dtype: Any) -> tuple[Any, Any]:
    """A CUDA tensor whose rows live in pinned host memory (the GPU reads them over the bus),
    and the pinned CPU tensor that owns the memory."""
    import cupy
    import torch

    owner = torch.empty((rows, dim), dtype=dtype, pin_memory=True)
    owner.uniform_(-0.01, 0.01)
    nbytes = owner.numel() * owner.element_size()
    # pinned memory is mapped into the device's address space (UVA): same address on both
    pointer = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(owner.data_ptr(), nbytes, owner), 0)
    cp_dtype = cupy.float32 if dtype == torch.float32 else cupy.float16
    array = cupy.ndarray((rows, dim), dtype=cp_dtype, memptr=pointer)
    return torch.as_tensor(array, device="cuda"), owner


def measure(device: str, rows: int, batch: int, reps: int, host: bool, dtypes: tuple[str, ...] = ("fp32",)) -> dict[str, Any]:
    """Raw timings (seconds) of every case; ``host``: also rows in host memory (CUDA only)."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "rows": rows, "batch": batch, "reps": reps, "cases": [],
    }
    size = GiB if device == "cuda" else GiB // 64
    src = torch.empty(size // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    out["device_memory_bw"] = 2 * size / _timed(lambda: dst.copy_(src), reps, device)
    src = dst = None  # free the buffers
    if device == "cuda":
        pinned = torch.empty(size // 4, dtype=torch.float32, pin_memory=True)
        dst = torch.empty(size // 4, dtype=torch.float32, device=device)
        out["host_to_device_bw"] = size / _timed(lambda: dst.copy_(pinned, non_blocking=True), reps, device)
        pinned = dst = None
    places = ("device", "host") if host and device == "cuda" else ("device",)
    kinds = [(place, dtype) for dtype in dtypes for place in places]
    for place, dtype in kinds:
        torch_dtype = {"fp32": torch.float32, "fp16": torch.float16}[dtype]
        for dim in DIMS:
            if place == "device":
                weight = torch.empty((rows, dim), dtype=torch_dtype, device=device).uniform_(-0.01, 0.01)
                owner = None
            else:
                try:
                    weight, owner = _host_mapped(rows, dim, torch_dtype)
                except Exception as exc:  # noqa: BLE001 - reported, the device cases stand
                    out["host_error"] = f"{type(exc).__name__}: {exc}"
                    break
            for pooling in POOLING:
                ids = torch.randint(0, rows, (batch * pooling,), dtype=torch.int64, device=device)
                offsets = torch.arange(0, batch * pooling, pooling, dtype=torch.int64, device=device)

                def run() -> Any:
                    return F.embedding_bag(ids, weight, offsets, mode="sum")  # noqa: B023

                seconds = _timed(run, reps, device)
                out["cases"].append(
                    {"place": place, "dtype": dtype, "dim": dim, "pooling": pooling, "seconds": seconds})
                print(f"{place:>6} {dtype} dim {dim:>3} pooling {pooling:>2}: {seconds * 1e6:10.1f} us", flush=True)
            weight = None  # free the table before the next one
            del owner
            if device == "cuda":
                torch.cuda.empty_cache()
    return out


def measure_updates(device: str, rows: int, batch: int, reps: int) -> list[dict[str, Any]]:
    """A data-parallel table's step outside the lookup: the dense-gradient backward of
    ``F.embedding_bag`` (pooling 8) and ``torch.optim`` SGD, Adagrad and Adam (their default,
    multi-tensor form) stepping the whole table, fp32."""
    import torch
    import torch.nn.functional as F

    out = []
    pooling = 8
    for dim in (32, 128):
        weight = torch.nn.Parameter(torch.empty((rows, dim), device=device).uniform_(-0.01, 0.01))
        ids = torch.randint(0, rows, (batch * pooling,), dtype=torch.int64, device=device)
        offsets = torch.arange(0, batch * pooling, pooling, dtype=torch.int64, device=device)
        pooled = F.embedding_bag(ids, weight, offsets, mode="sum")
        grad_out = torch.randn_like(pooled)

        def backward() -> Any:
            return torch.autograd.grad(pooled, weight, grad_out, retain_graph=True)  # noqa: B023

        seconds = _timed(backward, reps, device)
        out.append({"kind": "backward", "dim": dim, "pooling": pooling, "seconds": seconds})
        print(f"dense backward dim {dim:>3}: {seconds * 1e6:10.1f} us", flush=True)
        weight.grad = torch.randn_like(weight)
        for name, make in (("sgd", torch.optim.SGD), ("adagrad", torch.optim.Adagrad), ("adam", torch.optim.Adam)):
            optimizer = make([weight], lr=1e-3)
            seconds = _timed(optimizer.step, reps, device)
            out.append({"kind": "optimizer", "optimizer": name, "dim": dim, "seconds": seconds})
            print(f"{name:>7} step dim {dim:>3}: {seconds * 1e6:10.1f} us", flush=True)
            optimizer = None
        weight = pooled = grad_out = None
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def predict_updates(raw: dict[str, Any]) -> list[dict[str, float]]:
    """Neo's figures for each measured update: the data-parallel option's backward
    (``compute_bwd``) and optimizer step (``optimizer``: on GPUs the larger of its bytes and its
    measured passes, ``DP_OPTIMIZER_PASSES``), with the bytes alone and TorchRec's figure
    (``TORCHREC_DP_PASSES``) beside it."""
    import numpy as np

    from neo_core.api import make_context
    from neo_core.kernels import EmbeddingKernel, SparseOptimizer
    from neo_core.sharding import ShardingType, TableSpec
    from neo_plugins.sharding.planner.cost import CB, OPT, CostModel, TableArrays
    from neo_plugins.sharding.planner.search import build_options

    topo = _topology(raw)
    M = raw["device_memory_bw"]
    out = []
    for case in raw.get("updates", []):
        optimizer = SparseOptimizer(case.get("optimizer", "sgd"))
        model = CostModel(make_context(topo, raw["batch"], kernel=EmbeddingKernel("dense", "dense", optimizer=optimizer)))
        spec = TableSpec("t", raw["rows"], case["dim"], float(case.get("pooling", 1)))
        arrays = TableArrays.from_specs([spec])
        [option] = build_options(model, arrays, {ShardingType.DATA_PARALLEL})
        if case["kind"] == "backward":
            out.append({"predicted_s": float(option.cost.time[0, CB])})
            continue
        weights = raw["rows"] * case["dim"] * 4.0
        own = (weights + 2 * weights + 2 * raw["rows"] * float(model.opt_row_bytes(np.array([case["dim"]]))[0])) / M
        floor = TORCHREC_DP_PASSES * weights / M
        out.append({"predicted_s": float(option.cost.time[0, OPT]), "neo_bytes_s": own, "torchrec_s": floor})
    return out


def predict(raw: dict[str, Any], block_terms: bool) -> list[float]:
    """Neo's forward lookup time of every case, on a one-GPU topology with the measured ``M``
    (and ``H``; rows in host memory are costed as cache misses: hit rate 0)."""
    import numpy as np

    from neo_core.sharding import TableSpec
    from neo_plugins.sharding.planner.cost import CACHED, DEVICE, CostModel, TableArrays

    models = {dtype: CostModel(_lookup_context(raw, dtype)) for dtype in WEIGHT_BYTES}
    out = []
    for case in raw["cases"]:
        model = models[case.get("dtype", "fp32")]
        t = TableArrays.from_specs([TableSpec("t", raw["rows"], case["dim"], float(case["pooling"]))])
        n = np.array([raw["batch"] * case["pooling"]], dtype=np.float64)
        m = np.array([raw["batch"]], dtype=np.float64)
        place = DEVICE if case["place"] == "device" else CACHED
        fwd, _ = model._lookup(t, n, m, np.array([float(case["dim"])]), place, block_terms=block_terms)
        out.append(float(fwd[0]))
    return out


def predict_torchrec(raw: dict[str, Any]) -> list[float]:
    """TorchRec's ``EmbeddingPerfEstimator`` forward compute (``fwd_compute``) of every case: a
    table-wise shard on the same one-GPU topology, kernel ``fused`` for rows in device memory
    and ``fused_uvm_caching`` (cache load factor near 0) for rows in host memory."""
    from neo_core.sharding import ShardingType, TableSpec
    from neo_plugins.sharding.planner.cost import CACHED, CF, CostModel, TableArrays
    from neo_plugins.sharding.planner.search import build_options
    from neo_plugins.sharding.planner.torchrec_score import torchrec_option_costs

    out = [float("nan")] * len(raw["cases"])
    for dtype in WEIGHT_BYTES:
        mine = [i for i, c in enumerate(raw["cases"]) if c.get("dtype", "fp32") == dtype]
        if not mine:
            continue
        ctx = _lookup_context(raw, dtype)
        specs = [TableSpec(f"c{i}", raw["rows"], raw["cases"][i]["dim"], float(raw["cases"][i]["pooling"]))
                 for i in mine]
        model, arrays = CostModel(ctx), TableArrays.from_specs(specs)
        options = build_options(model, arrays, {ShardingType.TABLE_WISE})
        torchrec_option_costs(options, specs, ctx)
        for k, i in enumerate(mine):
            cached = raw["cases"][i]["place"] == "host"
            option = next(o for o in options if (o.placement == CACHED) == cached)
            out[i] = float(option.cost.time[k, CF]) if option.valid[k] else float("nan")
    return out


def _lookup_context(raw: dict[str, Any], dtype: str) -> Any:
    """The planning context both models cost the lookups in: one GPU with the measured
    bandwidths, the fused kernel with ``dtype`` weights, and a cache of almost no rows (rows in
    host memory are cache misses)."""
    from neo_core.api import make_context
    from neo_core.cache import CachePolicy
    from neo_core.kernels import EmbeddingKernel

    kernel = EmbeddingKernel("fused", "fused", weight_bytes=WEIGHT_BYTES[dtype])
    return make_context(_topology(raw), raw["batch"], kernel=kernel, cache=CachePolicy("lru", load_factor=1e-9))


def _topology(raw: dict[str, Any]) -> Any:
    """One GPU with the measured device-memory and host-to-device bandwidths."""
    from neo_core.topology import Topology

    M = raw["device_memory_bw"]
    H = raw.get("host_to_device_bw", M)
    return Topology(
        name="measured", num_nodes=1, devices_per_node=1, compute_device="cuda", device_memory=100 * GiB,
        host_memory=100 * GiB, device_memory_bw=M, host_memory_bw=H, host_to_device_bw=H,
        intra_node_bw=M, inter_node_bw=M,
    )


def report(raw: dict[str, Any]) -> dict[str, Any]:
    """Predicted against measured per case, with and without the narrow-row terms."""
    from fidelity import spearman  # the fidelity bench's (ties get average ranks)

    with_terms, plain = predict(raw, True), predict(raw, False)
    try:
        torchrec = predict_torchrec(raw)
    except ImportError:  # TorchRec not installed: Neo's figures alone
        torchrec = [float("nan")] * len(raw["cases"])
    rows = []
    for case, p, q, t in zip(raw["cases"], with_terms, plain, torchrec):
        rows.append({**case, "predicted_s": p, "predicted_plain_s": q, "measured_over_predicted": case["seconds"] / p,
                     "measured_over_plain": case["seconds"] / q, "torchrec_predicted_s": t,
                     "measured_over_torchrec": case["seconds"] / t})
    summary: dict[str, Any] = {}
    for place in sorted({f"{r['place']} {r.get('dtype', 'fp32')}" for r in rows}):
        mine = [r for r in rows if f"{r['place']} {r.get('dtype', 'fp32')}" == place]
        meas = [r["seconds"] for r in mine]
        tr = [r["measured_over_torchrec"] for r in mine if math.isfinite(r["measured_over_torchrec"])]
        summary[place] = {
            # measured over predicted: its median is the scale the formula misses, its spread the shape
            "median_ratio": statistics.median(r["measured_over_predicted"] for r in mine),
            "ratio_range": [min(r["measured_over_predicted"] for r in mine),
                            max(r["measured_over_predicted"] for r in mine)],
            "torchrec_median_ratio": statistics.median(tr) if tr else None,
            "torchrec_ratio_range": [min(tr), max(tr)] if tr else None,
            "spearman": spearman(meas, [r["predicted_s"] for r in mine]),
            "median_abs_error": statistics.median(abs(r["measured_over_predicted"] - 1) for r in mine),
            "spearman_plain": spearman(meas, [r["predicted_plain_s"] for r in mine]),
            "median_abs_error_plain": statistics.median(abs(r["measured_over_plain"] - 1) for r in mine),
            # measured time per modelled byte, each width against 128 columns (the penalty the
            # formula assumes: 1.75 below 64 columns, 1.15 below 128)
            "penalty_vs_128": {
                str(d): statistics.median(r["measured_over_plain"] for r in mine if r["dim"] == d)
                / statistics.median(r["measured_over_plain"] for r in mine if r["dim"] == 128)
                for d in DIMS if any(r["dim"] == d for r in mine)
            },
        }
    updates = [{**u, **p, "measured_over_predicted": u["seconds"] / p["predicted_s"]}
               for u, p in zip(raw.get("updates", []), predict_updates(raw))]
    return {**{k: v for k, v in raw.items() if k not in ("cases", "updates")}, "cases": rows, "summary": summary,
            "updates": updates}


def print_report(data: dict[str, Any]) -> None:
    print(f"{data['device']}, torch {data['torch']}: device memory {data['device_memory_bw'] / 1e9:,.0f} GB/s"
          + (f", host to device {data['host_to_device_bw'] / 1e9:,.1f} GB/s" if "host_to_device_bw" in data else ""))
    print(f"{'place':>6} {'type':>4} {'dim':>4} {'pool':>4} {'measured us':>12} {'Neo us':>10} {'meas/Neo':>9} "
          f"{'meas/plain':>10} {'TorchRec us':>12} {'meas/TR':>8}")
    for r in data["cases"]:
        print(f"{r['place']:>6} {r.get('dtype', 'fp32'):>4} {r['dim']:>4} {r['pooling']:>4} {r['seconds'] * 1e6:>12.1f} "
              f"{r['predicted_s'] * 1e6:>10.1f} {r['measured_over_predicted']:>9.2f} {r['measured_over_plain']:>10.2f} "
              f"{r['torchrec_predicted_s'] * 1e6:>12.1f} {r['measured_over_torchrec']:>8.2f}")
    for place, s in data["summary"].items():
        pen = ", ".join(f"{d}: {v:.2f}" for d, v in s["penalty_vs_128"].items())
        tr = s["torchrec_median_ratio"]
        print(f"{place}: measured/Neo median {s['median_ratio']:.2f} ({s['ratio_range'][0]:.2f}-{s['ratio_range'][1]:.2f})"
              + (f", measured/TorchRec median {tr:.3f} ({s['torchrec_ratio_range'][0]:.3f}-"
                 f"{s['torchrec_ratio_range'][1]:.3f})" if tr is not None else "")
              + f"; Spearman {s['spearman']:.3f}, median |error| {s['median_abs_error']:.0%} "
              f"(without the narrow-row terms: {s['spearman_plain']:.3f}, {s['median_abs_error_plain']:.0%}); "
              f"time per modelled byte against 128 columns: {pen}")
    for u in data.get("updates", []):
        what = "dense backward" if u["kind"] == "backward" else f"{u['optimizer']} step"
        parts = (f" (bytes alone {u['neo_bytes_s'] * 1e6:,.1f}, TorchRec {u['torchrec_s'] * 1e6:,.1f})"
                 if "neo_bytes_s" in u else "")
        print(f"{what:>15} dim {u['dim']:>3}: measured {u['seconds'] * 1e6:10.1f} us, Neo {u['predicted_s'] * 1e6:10.1f} us"
              f"{parts}, measured/Neo {u['measured_over_predicted']:.2f}")
    if "host_error" in data:
        print(f"rows in host memory not measured: {data['host_error']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--raw", type=Path, help="measure here and write the raw timings to this file")
    parser.add_argument("--report", type=Path, help="report on raw timings measured earlier")
    parser.add_argument("--json", type=Path, help="write the report (and a chart beside it)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a small check of this script")
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--batch", type=int, default=65_536)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--no-host", action="store_true", help="skip rows in host memory")
    parser.add_argument("--dtypes", default="fp32", help="weight types, comma-separated: fp32, fp16")
    parser.add_argument("--updates", action="store_true",
                        help="also a data-parallel table's dense backward and optimizer step")
    args = parser.parse_args(argv)
    if (args.raw is None) == (args.report is None):
        parser.error("give --raw FILE (measure) or --report FILE (report on a measurement)")
    if min(args.rows, args.batch, args.reps) < 1:
        parser.error("--rows, --batch and --reps must be at least 1")
    dtypes = tuple(d for d in args.dtypes.split(",") if d)
    if not dtypes or set(dtypes) - {"fp32", "fp16"}:
        parser.error(f"--dtypes takes fp32 and fp16, comma-separated; got {args.dtypes!r}")
    from args import check_writable

    check_writable(parser, "--json", args.json)  # before a measurement that it would lose
    check_writable(parser, "--raw", args.raw)
    if args.report is not None:
        try:
            raw = json.loads(args.report.read_text())
            assert isinstance(raw, dict) and {"cases", "device_memory_bw", "rows", "batch"} <= raw.keys()
        except (OSError, ValueError, AssertionError):
            parser.error(f"--report {args.report}: not raw timings of this bench (a JSON file written by --raw)")
    if args.raw is not None:
        import torch

        if args.device == "cuda" and not torch.cuda.is_available():
            parser.error("no CUDA device here; measure on a GPU machine, or --device cpu for a small check")
        raw = measure(args.device, args.rows, args.batch, args.reps, host=not args.no_host, dtypes=dtypes)
        if args.updates:
            raw["updates"] = measure_updates(args.device, args.rows, args.batch, args.reps)
        args.raw.write_text(json.dumps(raw, indent=1) + "\n")
        print(f"wrote {args.raw}")
        try:
            import neo_plugins  # noqa: F401
        except ImportError:
            print(f"Neo is not installed here: report with bench/gpu_lookup.py --report {args.raw}")
            return 0
    data = report(raw)
    print_report(data)
    if args.json is not None:
        args.json.write_text(json.dumps(data, indent=1) + "\n")
        from charts import chart

        print(f"wrote {args.json}, {chart(data, args.json.with_suffix('.png'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
