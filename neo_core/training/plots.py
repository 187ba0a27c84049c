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


CONTEXT = ("steps", "ranks", "batch/rank", "global batch", "cached tables")  # drawn only where jobs differ in them
SPREAD = (" p10", " p90")  # a result's per-step spread: "<column> p10", "<column> p90" beside "<column>"
CAPACITY = " capacity"  # what a result is held against: "<column> capacity" beside "<column>" (memory used)


def is_context(column: str, names: Any) -> bool:
    """Whether ``column`` says what the results are of (the ranks, a device's size) rather than
    a result: drawn only where jobs differ in it."""
    return column in CONTEXT or (column.endswith(CAPACITY) and column[: -len(CAPACITY)] in names)


def plot_sweep(jobs: list[tuple[str, dict[str, tuple[Any, ...]] | None]], path: Path, title: str) -> bool:
    """A sweep's results side by side: one panel per numeric result (a job's bar, its value
    written beside it), one row per job, labelled by what sets it apart. ``jobs``: (label,
    {column: (value, format[, unit])}), or (label, None) for a job that failed (its row says
    so). A result's ``<column> p10``/``p90`` are drawn as whiskers on its bar; results of
    :data:`CONTEXT` only where jobs differ in them. False where there is nothing to draw (no
    numeric result)."""
    import math

    rows = [row for _, row in jobs if row is not None]

    def numeric(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    names = list(dict.fromkeys(c for row in rows for c in row))
    spread = {c for c in names if c.endswith(SPREAD) and c[: -len(SPREAD[0])] in names}
    columns = [c for c in names
               if c not in spread and any(numeric(row.get(c, ("",))[0]) for row in rows)
               and not (is_context(c, names) and len({repr(row.get(c, ("",))[0]) for row in rows}) < 2)]
    if not rows or not columns:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(columns), figsize=(2.6 * len(columns) + 2.4, 0.42 * len(jobs) + 1.4),
                             sharey=True, squeeze=False)
    y = list(range(len(jobs)))[::-1]
    # bars coloured by a text result that sets jobs apart in a few values (whose model gave a
    # plan's times, which are not on one scale; the sharding types; a setting not used)
    texts = {c: [str(row[c][0]) for row in rows if c in row] for c in names if c not in columns and c not in spread
             and not any(numeric(row.get(c, ("",))[0]) for row in rows)}
    keyed = sorted((len(set(v)), c) for c, v in texts.items() if 1 < len(set(v)) <= 6 and len(v) == len(rows))
    key = keyed[0][1] if keyed else None
    kinds = list(dict.fromkeys(str(row[key][0]) for row in rows)) if key else []
    colors = [f"C{kinds.index(str(row[key][0]))}" if key and row is not None else "C0" for _, row in jobs]

    def number(row: dict[str, tuple[Any, ...]] | None, column: str) -> float:
        value = (row or {}).get(column, (math.nan,))[0]
        return float(value) if numeric(value) and math.isfinite(value) else math.nan  # n/a, or infinite

    for ax, column in zip(axes[0], columns):
        numbers = [number(row, column) for _, row in jobs]
        ax.barh(y, [0.0 if math.isnan(n) else n for n in numbers], color=colors)
        low, high = ([number(row, column + end) for _, row in jobs] for end in SPREAD)
        whiskers = [(yi, lo, hi) for yi, lo, hi in zip(y, low, high) if not (math.isnan(lo) or math.isnan(hi))]
        if whiskers:  # the per-step spread, 10th to 90th percentile
            ax.hlines([w[0] for w in whiskers], [w[1] for w in whiskers], [w[2] for w in whiskers],
                      color="black", linewidth=1)
        top = max([n for n in numbers + [w[2] for w in whiskers] if not math.isnan(n)], default=1.0) or 1.0
        for (_, row), yi, n in zip(jobs, y, numbers):
            # the value as the row gives it: a count stays a whole number ("2", not "2.0")
            said = " failed" if row is None else " n/a" if math.isnan(n) else f" {format(row[column][0], row[column][1])}"
            ax.text(0 if math.isnan(n) else n, yi, said, va="center", fontsize=7)
        ax.set_xlim(0, top * 1.45)
        unit = next((row[column][2] for row in rows if column in row and len(row[column]) > 2), "")
        spread_said = ", per-step 10th-90th percentile" if whiskers else ""
        ax.set_title(f"{column}{f' ({unit})' if unit else ''}{spread_said}", fontsize=9 if not whiskers else 8)
        ax.tick_params(axis="x", labelsize=7)
    axes[0][0].set_yticks(y, [label for label, _ in jobs], fontsize=7)
    if key:
        from matplotlib.patches import Patch

        fig.legend([Patch(color=f"C{i}") for i in range(len(kinds))], [f"{key}: {k or '-'}" for k in kinds],
                   loc="lower center", ncol=len(kinds), fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.06 if key else 0, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
