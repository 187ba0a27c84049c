"""Charts of benchmark results: the planner bench's ratios and times, the training bench's
samples/s, the fidelity bench's predicted against measured step times, the GPU lookup bench's
predicted against measured lookup times.

    .venv/bin/python bench/charts.py docs/results/bench_planner.json     # writes bench_planner.png
    .venv/bin/python bench/charts.py docs/results/fidelity_latest.json --out /tmp/fidelity.png

`bench/planner.py`, `bench/train.py`, `bench/fidelity.py` and `bench/gpu_lookup.py` write these beside their JSON; this command redraws
one from a JSON written earlier. The kind of result is read from the JSON itself.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# the targets, drawn as reference lines
QUALITY_TARGET = 0.85  # at least 15% below TorchRec's plan (production-like suite)
BOUND_TARGET = 1.10  # within 1.10x of the lower bound
FIDELITY_ERROR = 0.30  # median absolute error


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _case(row: dict[str, Any]) -> str:
    suite = row["suite"].replace("production_like", "prod").replace("mlperf_dcnv2", "mlperf").replace("zionex_", "")
    return f"{suite}\n{row['ranks']}"


def _legend(ax) -> None:
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def planner_chart(rows: list[dict[str, Any]], path: Path) -> Path:
    """Three panels over the benchmark's cases: Neo's plans against TorchRec's (TorchRec's
    estimator), each planner's plan against its lower bound, and planning time (log scale).
    Cases where TorchRec was cut by its time limit are hatched; missing values are left out."""
    plt = _pyplot()
    import numpy as np

    x = np.arange(len(rows))
    labels = [_case(r) for r in rows]
    fig, axes = plt.subplots(3, 1, figsize=(max(7.0, 0.7 * len(rows)) + 3.5, 9.5), sharex=True)

    def series(get) -> np.ndarray:
        out = []
        for r in rows:
            try:
                v = get(r)
            except (KeyError, TypeError):
                v = None
            out.append(np.nan if v is None else float(v))
        return np.array(out)

    cut = [bool(r.get("torchrec", {}).get("timed_out")) for r in rows]
    w = 0.38
    ax = axes[0]
    bars3 = (
        (-w * 2 / 3, "neo_over_torchrec", "neo / tr", "C0"),  # neo and neo[TR]: their colours below
        (0.0, "neo_cw128_over_torchrec", "neo128 / tr (TorchRec's column options)", "C4"),
        (w * 2 / 3, "neo_tr_est_over_torchrec", "neo[TR] / tr", "C1"),
    )
    for off, key, label, colour in bars3:
        vals = series(lambda r, k=key: r.get(k))
        bars = ax.bar(x + off, vals, w * 2 / 3, label=label, color=colour)
        for bar, c in zip(bars, cut):
            if c:
                bar.set_hatch("//")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(QUALITY_TARGET, color="C3", ls="--", lw=0.8, label=f"target {QUALITY_TARGET:.2f} (production-like)")
    ax.set_ylabel("slowest rank vs TorchRec's plan\n(TorchRec's estimator)")
    ax.set_title("Plan quality (lower is better; hatched: TorchRec stopped by its time limit)")
    for i, r in enumerate(rows):
        why = "no plan fits" if "does_not_fit" in r["neo"] else "TorchRec: no plan" if "error" in r.get("torchrec", {}) else ""
        if why and np.isnan(series(lambda q: q.get("neo_over_torchrec"))[i]):
            ax.text(i, 0.05, why, rotation=90, ha="center", va="bottom", fontsize=8, color="0.35")
    _legend(ax)

    ax = axes[1]
    for off, get, label in (
        (-w / 2, lambda r: r["neo"]["vs_bound"], "neo / its bound (Neo's model)"),
        (w / 2, lambda r: r["neo_torchrec_estimator"]["vs_bound"], "neo[TR] / its bound (TorchRec's estimator)"),
    ):
        ax.bar(x + off, series(get), w, label=label)
    ax.plot(x, series(lambda r: r.get("torchrec_vs_bound")), "k_", ms=14, mew=2, ls="none", label="tr / its bound")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(BOUND_TARGET, color="C3", ls="--", lw=0.8, label=f"target {BOUND_TARGET:.2f}")
    ax.set_ylabel("step / lower bound")
    ax.set_title("Distance from the lower bound")
    _legend(ax)

    ax = axes[2]
    for off, get, label in (
        (-w / 2, lambda r: r["neo"]["time_s"], "neo"),
        (0.0, lambda r: r["neo_torchrec_estimator"]["time_s"], "neo[TR]"),
        (w / 2, lambda r: r["torchrec"].get("plan_s", r["torchrec"].get("time_s")), "TorchRec"),
    ):
        bars = ax.bar(x + off, series(get), w / 2, label=label)
        if label == "TorchRec":
            for bar, c in zip(bars, cut):
                if c:
                    bar.set_hatch("//")
    ax.set_yscale("log")
    ax.set_ylabel("planning time (s)")
    ax.set_title("Planning time (log scale; for 'no plan fits', the time to prove it)")
    _legend(ax)
    ax.set_xticks(x, labels, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def fidelity_chart(data: dict[str, Any], path: Path) -> Path:
    """Predicted against measured step time per plan, with y = x and the +-30% band."""
    plt = _pyplot()
    plans = data["plans"]
    pred = [p["predicted_s"] * 1e3 for p in plans]
    meas = [p["measured_s"] * 1e3 for p in plans]
    # TorchRec's estimator on the same topology, where the result has it (runs before did not)
    tr = [p["torchrec_predicted_s"] * 1e3 for p in plans if "torchrec_predicted_s" in p]
    lo, hi = 0.8 * min(pred + meas + tr), 1.25 * max(pred + meas + tr)
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    line = [lo, hi]
    ax.plot(line, line, color="k", lw=0.8, label="predicted = measured")
    ax.fill_between(line, [v * (1 - FIDELITY_ERROR) for v in line], [v * (1 + FIDELITY_ERROR) for v in line],
                    color="C2", alpha=0.12, label=f"within {FIDELITY_ERROR:.0%}")
    ax.scatter(meas, pred, zorder=3, label="Neo's cost model")
    if len(tr) == len(plans):
        ax.scatter(meas, tr, zorder=3, marker="s", facecolors="none", edgecolors="C3",
                   label="TorchRec's estimator, same topology")
    placed: list[tuple[float, float]] = []  # labels of points within 4% of an earlier one go below it
    for p, m, q in sorted(zip(plans, meas, pred), key=lambda z: (z[2], z[1])):
        near = sum(abs(m / pm - 1) < 0.04 and abs(q / pq - 1) < 0.04 for pm, pq in placed)
        ax.annotate(p["plan"], (m, q), textcoords="offset points", xytext=(5, 3 - 11 * near), fontsize=8)
        placed.append((m, q))
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured step (ms)")
    ax.set_ylabel("predicted step (ms)")
    ax.set_title(
        f"Cost-model fidelity: Spearman {data['spearman']:.3f}, median |error| {data['median_abs_error']:.1%}\n"
        f"{len(plans)} plans, {data.get('world_size', '?')} ranks, batch {data.get('batch_size_per_rank', '?')} per rank"
        + (f"\nTorchRec's estimator: Spearman {data['torchrec_spearman']:.3f}, median |error| "
           f"{data['torchrec_median_abs_error']:.1%}" if len(tr) == len(plans) else ""),
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def train_chart(rows: list[dict[str, Any]], path: Path) -> Path:
    """Samples/s per training configuration, each labelled with its ratio to the baseline and
    its held-out AUC."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 0.55 * len(rows) + 1.6))
    y = list(range(len(rows)))[::-1]
    vals = [r["samples_per_sec"] for r in rows]
    ax.barh(y, vals, color=["0.6"] + ["C0"] * (len(rows) - 1))
    for yi, r in zip(y, rows):  # the per-step rate's 10th-90th percentile, where the run had it
        if spread := r.get("samples_per_sec_p10_p90"):
            ax.plot(spread, [yi, yi], color="k", lw=1.2, marker="|", ms=8)
    for yi, r in zip(y, rows):
        ax.text(max([r["samples_per_sec"], *(r.get("samples_per_sec_p10_p90") or ())]), yi, f"  {r.get('ratio', float('nan')):.2f}x, AUC {r.get('val_auc', float('nan')):.3f}",
                va="center", fontsize=8)
    ax.set_yticks(y, [r["config"] for r in rows], fontsize=8)
    ax.set_xlim(0, 1.3 * max(v for r in rows for v in (r["samples_per_sec"], *(r.get("samples_per_sec_p10_p90") or ()))))
    ax.set_xlabel("samples/s (global); whiskers: per-step rate, 10th-90th percentile")
    first = rows[0]
    ax.set_title(
        f"Training throughput, {first.get('world_size', '?')} ranks, global batch {first.get('global_batch_size', '?')}, "
        f"{first.get('steps', '?')} steps (ratios to the first row)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def gpu_lookup_chart(data: dict[str, Any], path: Path) -> Path:
    """Measured lookup time against each model's prediction, one panel per weight type;
    rows in device memory and in host memory marked apart, y = x drawn."""
    plt = _pyplot()
    cases = data["cases"]
    dtypes = sorted({c.get("dtype", "fp32") for c in cases}, reverse=True)
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6.0 * len(dtypes), 5.2), squeeze=False)
    for ax, dtype in zip(axes[0], dtypes):
        mine = [c for c in cases if c.get("dtype", "fp32") == dtype]
        values = [c["seconds"] * 1e6 for c in mine] + [c["predicted_s"] * 1e6 for c in mine]
        values += [c["torchrec_predicted_s"] * 1e6 for c in mine if c.get("torchrec_predicted_s") == c.get(
            "torchrec_predicted_s")]  # not NaN
        lo, hi = 0.7 * min(values), 1.4 * max(values)
        ax.plot([lo, hi], [lo, hi], color="k", lw=0.8, label="predicted = measured")
        for place, marker in (("device", "o"), ("host", "s")):
            sel = [c for c in mine if c["place"] == place]
            if not sel:
                continue
            ax.scatter([c["seconds"] * 1e6 for c in sel], [c["predicted_s"] * 1e6 for c in sel], marker=marker,
                       color="C0", label=f"Neo, rows in {place} memory", zorder=3)
            tr = [c for c in sel if c.get("torchrec_predicted_s") == c.get("torchrec_predicted_s")]
            if tr:
                ax.scatter([c["seconds"] * 1e6 for c in tr], [c["torchrec_predicted_s"] * 1e6 for c in tr],
                           marker=marker, facecolors="none", edgecolors="C3",
                           label=f"TorchRec, rows in {place} memory", zorder=3)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured forward lookup (us)")
        ax.set_ylabel("predicted (us)")
        ax.set_title(f"{dtype} weights", fontsize=10)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Embedding-bag forward on {data.get('device', '?')} (PyTorch's kernel), {data.get('batch', '?')} "
                 f"bags, {data.get('rows', 0):,} rows", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def chart(data: Any, path: Path) -> Path:
    """The chart for whichever bench wrote ``data``."""
    if isinstance(data, list) and data and isinstance(data[0], dict) and {"suite", "ranks", "neo"} <= data[0].keys():
        return planner_chart(data, path)
    if isinstance(data, list) and data and isinstance(data[0], dict) and {"config", "samples_per_sec"} <= data[0].keys():
        return train_chart(data, path)
    if isinstance(data, dict) and {"plans", "spearman", "median_abs_error"} <= data.keys():
        return fidelity_chart(data, path)
    if isinstance(data, dict) and {"cases", "summary", "device_memory_bw"} <= data.keys():
        return gpu_lookup_chart(data, path)
    raise ValueError(
        "not a result of bench/planner.py (a list of cases), bench/train.py (a list of configurations), "
        "bench/fidelity.py (plans, spearman) nor bench/gpu_lookup.py's report (cases, summary)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path, help="a JSON written by bench/planner.py, bench/train.py or bench/fidelity.py")
    parser.add_argument("--out", type=Path, default=None, help="PNG to write (default: the JSON's name, .png)")
    args = parser.parse_args(argv)
    try:
        data = json.loads(args.json.read_text())
    except OSError as exc:
        parser.error(f"{args.json}: cannot be read ({exc.strerror})")
    except json.JSONDecodeError as exc:
        parser.error(f"{args.json}: not JSON ({exc})")
    out = args.out or args.json.with_suffix(".png")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)  # a folder not there yet is made, as for --json
        written = chart(data, out)
    except ValueError as exc:
        parser.error(f"{args.json}: {exc}")
    except OSError as exc:
        parser.error(f"{out}: cannot be written ({exc.strerror})")
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
