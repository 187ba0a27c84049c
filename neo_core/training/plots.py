"""Training curves as a PNG: loss per step and held-out AUC."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def chart_title(metrics: dict[str, Any], extra: str = "") -> str:
    """The chart's title: model, sharding, kernel and the samples/s, with the steps it covers
    where a resumed run timed only its own segment."""
    rate = f"{metrics.get('samples_per_sec', 0):,.0f} samples/s"
    if metrics.get("timed_from_step", 1) > 1:
        since = metrics.get("samples_per_sec_from_step", metrics["timed_from_step"])
        rate += f" (resumed: steps {since}-{metrics.get('steps')})"
    return f"{metrics.get('model')} / {metrics.get('sharding')} / {metrics.get('kernel')}{extra}: {rate}"


def plot_training(metrics: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hist = metrics.get("history", [])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    if hist:
        ax.plot([h["step"] for h in hist], [h["loss"] for h in hist], lw=0.8, label="train loss (rank 0)")
    val = metrics.get("val_history", [])
    if val:
        ax.scatter([v["step"] for v in val], [v["loss"] for v in val], color="C1", label="val loss", zorder=3)
        ax2 = ax.twinx()
        ax2.plot([v["step"] for v in val], [v["auc"] for v in val], "o-", color="C2", label="val AUC")
        ax2.set_ylabel("val AUC")
        ax2.legend(loc="upper right")
    ax.set_xlabel("step")
    ax.set_ylabel("BCE loss")
    ax.legend(loc="upper left")
    # cache and compression when set: a sweep over them drew charts that looked alike
    extra = "".join(f" / {kind} {metrics[kind]}" for kind in ("cache", "compression")
                    if metrics.get(kind) not in (None, "none"))
    ax.set_title(chart_title(metrics, extra))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_sweep(jobs: list[tuple[str, dict[str, tuple[Any, ...]]]], path: Path, title: str) -> bool:
    """A sweep's results side by side: one panel per numeric result (a job's bar, its value
    written beside it), one row per job, labelled by what sets it apart. ``jobs``: (label,
    {column: (value, format[, unit])}) of the jobs that finished. False where there is nothing
    to draw (no numeric result)."""
    import math

    columns = [c for c in dict.fromkeys(c for _, row in jobs for c in row)
               if c != "steps" and any(isinstance(row.get(c, ("",))[0], (int, float))
                                       and not isinstance(row.get(c, ("",))[0], bool) for _, row in jobs)]
    if not jobs or not columns:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(columns), figsize=(2.6 * len(columns) + 2.4, 0.42 * len(jobs) + 1.4),
                             sharey=True, squeeze=False)
    y = list(range(len(jobs)))[::-1]
    # bars coloured by a text result that sets jobs apart in a few values (whose model gave a
    # plan's times: those are not on one scale)
    texts = {c: [str(row[c][0]) for _, row in jobs if c in row] for c in dict.fromkeys(c for _, r in jobs for c in r)
             if c not in columns}
    keyed = sorted((len(set(v)), c) for c, v in texts.items() if 1 < len(set(v)) <= 6 and len(v) == len(jobs))
    key = keyed[0][1] if keyed else None
    kinds = list(dict.fromkeys(str(row[key][0]) for _, row in jobs)) if key else []
    colors = [f"C{kinds.index(str(row[key][0]))}" if key else "C0" for _, row in jobs]
    for ax, column in zip(axes[0], columns):
        values = [row.get(column, (math.nan,)) for _, row in jobs]
        numbers = [float(v[0]) if isinstance(v[0], (int, float)) and math.isfinite(v[0]) else math.nan
                   for v in values]  # not measured, or infinite (a plan of no step time): n/a
        ax.barh(y, [0.0 if math.isnan(n) else n for n in numbers], color=colors)
        top = max([n for n in numbers if not math.isnan(n)], default=1.0) or 1.0
        for yi, n, v in zip(y, numbers, values):
            ax.text(0 if math.isnan(n) else n, yi, " n/a" if math.isnan(n) else f" {format(n, v[1])}",
                    va="center", fontsize=7)
        ax.set_xlim(0, top * 1.45)
        unit = next((v[2] for v in values if len(v) > 2), "")
        ax.set_title(f"{column}{f' ({unit})' if unit else ''}", fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
    axes[0][0].set_yticks(y, [label for label, _ in jobs], fontsize=7)
    if key:
        from matplotlib.patches import Patch

        fig.legend([Patch(color=f"C{i}") for i in range(len(kinds))], [f"{key}: {k}" for k in kinds],
                   loc="lower center", ncol=len(kinds), fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.06 if key else 0, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
