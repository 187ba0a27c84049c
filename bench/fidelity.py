"""Cost-model fidelity: Neo's predicted step time against the measured one, for several plans.

    .venv/bin/python -m neo_plugins.sharding.planner.calibrate --out calibration.json
    .venv/bin/python bench/fidelity.py --calibration calibration.json --json fidelity.json
    .venv/bin/python bench/fidelity.py --model comm --compression none,fp16,bf16 ...  # compression

One model (8 embedding tables: 4 large, 4 small; ``--model lookup``, the default, with heavy
pooling, ``--model comm`` with one id per sample of wide rows), several plans of it on
the ``local`` topology (2 CPU ranks, bandwidths from the calibration file), each costed by
Neo's cost model (``score_assignments``: the same report ``NeoPlanner`` produces). Every plan
is then run on 2 gloo ranks with DMP (one torch thread per rank, as ``neo_core/training/run.py``
sets on 2 cores): forward, backward and the fused optimizer of the embedding tables (torch's Adagrad
for data-parallel tables). All plans live in one pair of processes and are timed in rounds,
the plans in a shuffled order each round, so slow phases of a busy machine hit every plan
alike. Every step is timed from a barrier to a barrier, and the larger of the two ranks'
times is kept (the slowest rank bounds the step). A plan's measured step time is a low
quantile of its steps (``--quantile``, default the 10th percentile): the model predicts an
undisturbed machine, and on a shared one the slow steps are the disturbed ones (the median is
reported too). ``--nice N`` runs the ranks at raised priority (root only), which keeps
concurrent jobs off their cores. Reports Spearman's rank correlation and the median absolute
percentage error of predicted vs measured, and the load average before and after.

For comparison every plan is also costed by TorchRec's ``EmbeddingPerfEstimator`` (max over
ranks of summed ``Perf.total``, as ``bench/planner.py`` scores plans) on the same calibrated
topology, so both models are checked against the same measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from args import check_writable  # noqa: E402
from charts import fidelity_chart  # noqa: E402

from neo_core.errors import ConfigError  # noqa: E402

WORLD_SIZE = 2
BATCH_PER_RANK = 1024
# the models (``--model``), each table as name -> (rows, dim, ids per sample): "lookup", heavy
# pooling, whose steps are mostly lookups; "comm", one id per sample and wide rows, whose steps
# are mostly all-to-alls of pooled rows (what compression changes)
MODELS: dict[str, dict[str, tuple[int, int, int]]] = {
    "lookup": {
        **{f"large{i}": (200_000, 64, 32) for i in range(4)},
        **{f"small{i}": (20_000, 32, 4) for i in range(4)},
    },
    "comm": {
        **{f"large{i}": (100_000, 128, 1) for i in range(4)},
        **{f"small{i}": (20_000, 64, 1) for i in range(4)},
    },
}
TABLES: dict[str, tuple[int, int, int]] = dict(MODELS["lookup"])  # the model measured


def use_model(name: str) -> None:
    """Measure the model ``name`` of ``MODELS`` (in this process; the ranks are told)."""
    TABLES.clear()
    TABLES.update(MODELS[name])


def specs() -> list[Any]:
    from neo_core.sharding import TableSpec

    return [TableSpec(n, r, d, float(p)) for n, (r, d, p) in TABLES.items()]


def context(calibration: str | None, compression: str = "none") -> Any:
    from neo_core.api import make_context
    from neo_plugins.topology.local import local_topology

    topo = local_topology(world_size=WORLD_SIZE, compute_device="cpu", calibration=calibration)
    return make_context(topo, BATCH_PER_RANK, compressor=compression)


# the plans also run compressed (``--compression``): those that send pooled embeddings, each
# sharding type's way (data parallel sends none)
COMPRESSED = ("TW balanced", "RW", "CW x2", "Neo planner")


def every_plan(calibration: str | None, compressions: list[str]) -> dict[str, tuple[Any, Any]]:
    """Plan name -> (PlanResult, its context): every plan uncompressed, and those of
    ``COMPRESSED`` with each compressor of ``compressions`` (named "<plan> <compressor>")."""
    out = {}
    for compression in compressions:
        ctx = context(calibration, compression)
        for name, result in plans(ctx).items():
            if compression == "none":
                out[name] = (result, ctx)
            elif name in COMPRESSED:
                out[f"{name} {compression}"] = (result, ctx)
    return out


def plans(ctx: Any) -> dict[str, Any]:
    """Plan name -> PlanResult scored by Neo's cost model."""
    from neo_core.sharding import TableAssignment
    from neo_plugins.sharding.planner import NeoPlanner
    from neo_plugins.sharding.planner.score import score_assignments

    names = list(TABLES)
    large = [n for n in names if n.startswith("large")]
    small = [n for n in names if n.startswith("small")]

    def fixed(kind: dict[str, tuple[str, list[int]]]) -> list[Any]:
        kernel = {"data_parallel": "dense"}
        return [TableAssignment(n, st, kernel.get(st, "fused"), ranks) for n, (st, ranks) in kind.items()]

    layouts = {
        "TW balanced": {n: ("table_wise", [i % 2]) for i, n in enumerate(names)},
        "TW on rank 0": {n: ("table_wise", [0]) for n in names},
        "TW large on rank 0": {n: ("table_wise", [0 if n in large else 1]) for n in names},
        "RW": {n: ("row_wise", [0, 1]) for n in names},
        "CW x2": {n: ("column_wise", [0, 1]) for n in names},
        "DP": {n: ("data_parallel", [0, 1]) for n in names},
        "RW large, DP small": {
            **{n: ("row_wise", [0, 1]) for n in large},
            **{n: ("data_parallel", [0, 1]) for n in small},
        },
    }
    tables = specs()
    out = {name: score_assignments(tables, fixed(kind), ctx, planner=name) for name, kind in layouts.items()}
    out["Neo planner"] = NeoPlanner().plan(tables, ctx)
    return out


def torchrec_predictions(results: dict[str, tuple[Any, Any]]) -> dict[str, float]:
    """Plan name -> TorchRec's estimate of its step (s) on the same topology and compressor
    (``results``: plan name -> (PlanResult, context)): the slowest rank's summed ``Perf.total``,
    which has no dense part and no fixed cost per step."""
    from neo_plugins.sharding.planner.torchrec_score import score_plan

    tables = specs()
    return {name: score_plan(tables, result, ctx) / 1e3 for name, (result, ctx) in results.items()}


# ---- measurement (2 gloo ranks) -----------------------------------------------------
def _batches(rank: int, steps: int) -> list[Any]:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    gen = torch.Generator().manual_seed(100 + rank)
    out = []
    for _ in range(steps):
        keys, lengths, values = [], [], []
        for name, (rows, _, pool) in TABLES.items():
            keys.append(f"f_{name}")
            lengths.append(torch.full((BATCH_PER_RANK,), pool, dtype=torch.long))
            values.append(torch.randint(0, rows, (BATCH_PER_RANK * pool,), generator=gen))
        out.append(
            KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.cat(values), lengths=torch.cat(lengths))
        )
    return out


def _rank(rank: int, port: int, calibration: str | None, rounds: int, steps: int, out: str, nice: int,
          compressions: list[str], model: str) -> None:
    use_model(model)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(WORLD_SIZE), RANK=str(rank),
        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD_SIZE),
    )
    if nice:
        os.nice(-nice)  # PermissionError without root / CAP_SYS_NICE
    torch.set_num_threads(1)  # one core per rank, as neo_core/training/run.py sets on 2 cores
    torch.set_num_interop_threads(1)
    from neo_core.training.run import quiet_libraries

    quiet_libraries()  # TorchRec's per-table notes and deprecation warnings, as in training ranks
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from neo_core.torchrec_plan import build_sharding_plan
    from neo_plugins.sharding.sharders import make_sharders

    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    configs = [
        EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=[f"f_{n}"])
        for n, (r, d, _) in TABLES.items()
    ]
    batches = _batches(rank, steps)
    models = {}
    sharders = {}  # by context: a compressor's codecs are its sharders'
    for name, (result, ctx) in every_plan(calibration, compressions).items():
        if id(ctx) not in sharders:
            sharders[id(ctx)] = make_sharders(ctx)
        torch.manual_seed(0)
        ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
        plan = build_sharding_plan(ebc, result, ctx, sharders[id(ctx)])
        dmp = DistributedModelParallel(
            ebc, env=ShardingEnv.from_process_group(dist.group.WORLD), device=torch.device("cpu"),
            plan=plan, sharders=sharders[id(ctx)],
        )
        dense = dict(in_backward_optimizer_filter(dmp.named_parameters()))
        # replicated tables: torch.optim's Adagrad, as training steps them under row-wise Adagrad
        # (EmbeddingKernel.replica_optimizer), the optimizer the cost model is given
        opt = KeyedOptimizerWrapper(dense, lambda ps: torch.optim.Adagrad(ps, lr=0.01)) if dense else None
        models[name] = (dmp, opt)

    def step(dmp: Any, opt: Any, kjt: Any) -> None:
        pooled = dmp(kjt).values()
        pooled.sum().backward()
        if opt is not None:
            opt.step()
            opt.zero_grad()

    times: dict[str, list[float]] = {name: [] for name in models}
    for dmp, opt in models.values():  # warm-up
        for i in range(3):
            step(dmp, opt, batches[i % len(batches)])
    order = list(models)
    for r in range(rounds):
        random.Random(r).shuffle(order)  # same order on both ranks; no plan always follows another
        for name in order:
            dmp, opt = models[name]
            for kjt in batches:  # every step from barrier to barrier: bounded by the slowest rank
                dist.barrier()
                start = time.perf_counter()
                step(dmp, opt, kjt)
                dist.barrier()
                times[name].append(time.perf_counter() - start)
    torch.save(times, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def measure(calibration: str | None, rounds: int, steps: int, nice: int = 0,
            compressions: list[str] | None = None, model: str = "lookup") -> dict[str, list[float]]:
    """Per plan, the seconds of every timed step: barrier to barrier, the larger of the two ranks' clocks."""
    import torch.multiprocessing as mp

    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # inherited by the spawned ranks

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _rank, args=(port, calibration, rounds, steps, tmp, nice, compressions or ["none"], model), nprocs=WORLD_SIZE,
            start_method="spawn"
        )
        per_rank = [torch.load(Path(tmp) / f"rank{r}.pt") for r in range(WORLD_SIZE)]
    return {name: [max(ts) for ts in zip(*(t[name] for t in per_rank))] for name in per_rank[0]}


# ---- statistics ----------------------------------------------------------------------
def compression_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each compressed plan ("<plan> <compressor>"), its step over the same plan's
    uncompressed one, measured and predicted."""
    by_name = {r["plan"]: r for r in rows}
    out = []
    for r in rows:
        base = by_name.get(r["plan"].rsplit(" ", 1)[0])
        if base is None or base is r:
            continue
        out.append({"plan": r["plan"], "measured": r["measured_s"] / base["measured_s"],
                    "predicted": r["predicted_s"] / base["predicted_s"]})
    return out


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (Pearson on ranks; ties get average ranks)."""
    rx, ry = _ranks(x), _ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else 0.0


def _quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (linear interpolation; 0: the minimum)."""
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _load(avg: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.2f}" for x in avg)


def cpu_model() -> str:
    """' (<model>, <widest vector unit>)' from /proc/cpuinfo, '' where it cannot be read: the
    fused CPU kernel's per-id cost moves with the processor, so a result says which it ran on."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    vector = next((v for v in ("avx512f", "avx2", "avx") if v in flags), "")
    return f" ({', '.join(filter(None, (model, vector)))})" if model or vector else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibration", default=None, help="calibration JSON (default: $NEO_CALIBRATION, else ~/.cache/neo/calibration.json)")
    parser.add_argument("--rounds", type=int, default=60, help="rounds over the plans, in a new shuffled order each round; a round times each plan --steps times "
                             "(default 60)")
    parser.add_argument("--steps", type=int, default=1, help="steps per plan and round (each timed; default 1)")
    parser.add_argument(
        "--quantile", type=float, default=0.1,
        help="a plan's measured step time: this quantile of its timed steps (0: the fastest; default 0.1)",
    )
    parser.add_argument(
        "--nice", type=int, default=0,
        help="run the ranks this much above normal priority, 0 or more (needs root): concurrent jobs disturb them less",
    )
    parser.add_argument(
        "--compression", default="none",
        help="comma-separated compressors: the plans that send pooled embeddings also run with each (e.g. none,fp16,bf16; "
             "default none); a compressor's encoding and decoding run on the ranks' cores",
    )
    parser.add_argument(
        "--model", choices=sorted(MODELS), default="lookup",
        help="lookup: heavy pooling, steps mostly lookups (default); comm: one id per sample of wide rows, steps "
             "mostly all-to-alls of pooled rows, which compression changes",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    compressions = [c.strip() for c in args.compression.split(",") if c.strip()]
    if "none" not in compressions:
        compressions.insert(0, "none")
    for flag, value in (("--rounds", args.rounds), ("--steps", args.steps)):
        if value < 1:
            parser.error(f"{flag} {value}: must be at least 1")
    if not 0.0 <= args.quantile <= 1.0:
        parser.error(f"--quantile {args.quantile}: must lie in [0, 1]")
    if args.nice < 0:  # as neo calibrate: a negative one would lower the ranks' priority
        parser.error(f"--nice {args.nice}: give how far above normal priority, 0 or more")
    check_writable(parser, "--json", args.json)
    if args.calibration is not None and not Path(args.calibration).is_file():
        parser.error(f"--calibration {args.calibration}: not a file; write one with "
                     f"`.venv/bin/python -m neo_plugins.sharding.planner.calibrate --out {args.calibration}`")
    start = time.perf_counter()
    use_model(args.model)  # the arguments checked: a refused run leaves the module's model as it was
    try:
        results = every_plan(args.calibration, compressions)
    except ConfigError as exc:  # a missing or damaged calibration file, an unknown compressor: one line
        parser.error(str(exc))
    ctx = next(iter(results.values()))[1]
    torchrec = torchrec_predictions(results)
    print(ctx.topology.describe())
    load_before = os.getloadavg()
    times = measure(args.calibration, args.rounds, args.steps, args.nice, compressions, args.model)
    load_after = os.getloadavg()
    rows = []
    for name, (result, _) in results.items():
        measured = _quantile(times[name], args.quantile)
        predicted = result.predicted_step_time
        types = sorted({a.sharding_type for a in result.tables})
        rows.append({
            "plan": name,
            "types": types,
            "predicted_s": predicted,
            "measured_s": measured,
            "measured_median_s": statistics.median(times[name]),
            "measured_min_s": min(times[name]),
            "measured_steps_s": times[name],
            "error": predicted / measured - 1.0,
            "torchrec_predicted_s": torchrec[name],
            "torchrec_error": torchrec[name] / measured - 1.0,
            "predicted_by_rank": [r.time for r in result.ranks],
        })
    pred = [r["predicted_s"] for r in rows]
    meas = [r["measured_s"] for r in rows]
    rho = spearman(pred, meas)
    mape = statistics.median(abs(r["error"]) for r in rows)
    tr_rho = spearman([r["torchrec_predicted_s"] for r in rows], meas)
    tr_mape = statistics.median(abs(r["torchrec_error"]) for r in rows)
    print(f"\n{'plan':<22} {'predicted ms':>13} {'measured ms':>12} {'error':>8}  {'TorchRec ms':>12} {'error':>8}")
    for r in rows:
        print(f"{r['plan']:<22} {r['predicted_s'] * 1e3:>13.2f} {r['measured_s'] * 1e3:>12.2f} {r['error']:>+8.0%}"
              f"  {r['torchrec_predicted_s'] * 1e3:>12.2f} {r['torchrec_error']:>+8.0%}")
    compressed = compression_ratios(rows)
    if compressed:  # what compression changes, measured and predicted: the question it answers
        print(f"\n{'compressed over uncompressed':<28} {'measured':>9} {'predicted':>10}")
        for r in compressed:
            print(f"{r['plan']:<28} {r['measured']:>9.3f} {r['predicted']:>10.3f}")
    print(f"\nSpearman {rho:.3f} (target >= 0.8), median |error| {mape:.1%} (target <= 30%), "
          f"{len(rows)} plans, {time.perf_counter() - start:.0f} s")
    print(f"TorchRec's estimator on the same topology: Spearman {tr_rho:.3f}, median |error| {tr_mape:.1%}")
    print(f"load average (1/5/15 min) before {_load(load_before)}, after {_load(load_after)} on {os.cpu_count()} cpus")
    if load_before[0] > 0.5 * (os.cpu_count() or 1):  # before the ranks started: other work
        print(f"warning: the machine was busy as the run started (load {load_before[0]:.2f} on {os.cpu_count()} cpus): "
              "other work shared the ranks' cores, so the measured steps are slower and noisier than the model "
              "expects and these figures may not hold; run it again on an idle machine", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({
            "spearman": rho,
            "median_abs_error": mape,
            "torchrec_spearman": tr_rho,
            "torchrec_median_abs_error": tr_mape,
            "batch_size_per_rank": BATCH_PER_RANK,
            "world_size": WORLD_SIZE,
            "model": args.model,
            "compression": compressions,
            "tables": TABLES,
            "topology": ctx.topology.to_dict(),
            "rounds": args.rounds,
            "quantile": args.quantile,
            "nice": -args.nice,
            "load_average_before": load_before,
            "load_average_after": load_after,
            "steps": args.steps,
            "machine": f"{platform.machine()} {os.cpu_count()} cpus{cpu_model()}, torch {torch.__version__}",
            "plans": rows,
            "compressed_over_uncompressed": compressed,
        }, indent=2) + "\n")
        chart = fidelity_chart(json.loads(args.json.read_text()), args.json.with_suffix(".png"))
        print(f"wrote {args.json} and {chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
