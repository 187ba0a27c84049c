"""Training curves as a PNG: loss per step and held-out AUC."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
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
# a result that leaves a reserve out ("fullest rank device memory without the reserve") is held
# against the whole capacity, reserve and all ("fullest rank device memory capacity")
RESERVE_LEFT_OUT = " without the reserve"


def capacity_of(column: str) -> str:
    """The column ``column`` is held against (:data:`CAPACITY`, :data:`RESERVE_LEFT_OUT`)."""
    return column.removesuffix(RESERVE_LEFT_OUT) + CAPACITY


def is_capacity(column: str, names: Any) -> bool:
    """Whether ``column`` is what another of ``names`` is held against (drawn on that one)."""
    return column.endswith(CAPACITY) and any(n != column and capacity_of(n) == column for n in names)


def is_context(column: str, names: Any) -> bool:
    """Whether ``column`` says what the results are of (the ranks, a device's size) rather than
    a result: drawn only where jobs differ in it."""
    return column in CONTEXT or is_capacity(column, names)


Row = dict[str, tuple[Any, ...]]  # a job's results: {column: (value, format[, unit])}


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(row: Row | None, column: str) -> float:
    """A job's result as a number to draw; NaN where it has none, or it is infinite."""
    value = (row or {}).get(column, (math.nan,))[0]
    return float(value) if _numeric(value) and math.isfinite(value) else math.nan


def drawn_columns(rows: list[Row]) -> list[str]:
    """The results a sweep's chart has a panel for: the numeric ones, but a spread (drawn on
    its result) and a context result (:func:`is_context`) where jobs do not differ in it."""
    names = list(dict.fromkeys(c for row in rows for c in row))
    spread = {c for c in names if c.endswith(SPREAD) and c[: -len(SPREAD[0])] in names}
    return [c for c in names
            if c not in spread and any(_numeric(row.get(c, ("",))[0]) for row in rows)
            and not (is_context(c, names) and len({repr(row.get(c, ("",))[0]) for row in rows}) < 2)]


@dataclass
class SweepLines:
    """What summary.png draws for a sweep over a numeric setting: each result against its value."""

    x: str  # the numeric setting along the x-axis (topology.inter_node_bw_gbps)
    by: list[str]  # the sweep's other varied settings: a line per combination of their values
    log_x: bool  # the values span more than 10x
    columns: list[str]  # a panel each
    # per line ("cache=lru"; "" where nothing else varies), per column: (x, value), by x; a job
    # without the result (n/a) has no point
    lines: dict[str, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)
    # per line, per column: (x, 10th, 90th percentile) of a per-step result
    spread: dict[str, dict[str, list[tuple[float, float, float]]]] = field(default_factory=dict)
    # per line: (x, "failed" | "stopped" | "not run") of the jobs without results, marked at their x
    missing: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    # per line, per column: (x, capacity) of a result held against one (memory against the
    # device's), drawn dashed in the result's panel, not in a panel of its own
    capacity: dict[str, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)


def _as_number(value: str | None) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


# at most this many lines to a panel; a sweep of more combinations is drawn as bars
MAX_LINES = 8


def sweep_lines(jobs: list[tuple[str, Row | None]], settings: list[dict[str, str]],
                statuses: list[str] | None = None) -> SweepLines | None:
    """The lines a sweep's chart draws where the sweep varies a numeric setting (``settings``:
    each job's overrides, key to value): every result against that setting's value, a line
    per value of the other varied settings. Of several numeric settings the one with the most
    values is the x-axis (a tie: the first given); a seed is a name, not a quantity. None where
    the sweep varies none (``sharding=neo,torchrec``), no job has results, the lines would be
    over :data:`MAX_LINES`, or none has two points: the chart is a bar per job. ``statuses``:
    each job's word where it has no results (by default "failed")."""
    rows = [row for _, row in jobs if row is not None]
    if len(jobs) < 2 or len(settings) != len(jobs) or not rows:
        return None
    keys = list(dict.fromkeys(k for s in settings for k in s))
    varied = [k for k in keys if len({s.get(k) for s in settings}) > 1]
    numeric = [k for k in varied if k.rsplit(".", 1)[-1] != "seed"
               and all(_as_number(s.get(k)) is not None for s in settings)]
    if not numeric:
        return None
    x = max(numeric, key=lambda k: (len({_as_number(s[k]) for s in settings}), -numeric.index(k)))
    by = [k for k in varied if k != x]
    names = [" ".join(f"{k}={s.get(k, '-')}" for k in by) for s in settings]
    labels = list(dict.fromkeys(names))
    if len(labels) > MAX_LINES or all(names.count(label) < 2 for label in labels):
        return None
    xs = [_as_number(s[x]) or 0.0 for s in settings]
    # a result no job has a number for (TorchRec's plans give no bytes: NaN) has no line to draw;
    # a capacity is drawn in its result's panel (a panel of its own repeated the swept device size)
    drawn = [c for c in bar_columns(rows) if any(math.isfinite(_number(row, c)) for row in rows)]
    held = [c for c in drawn if any(capacity_of(c) in row for row in rows)]
    chart = SweepLines(x=x, by=by, log_x=min(xs) > 0 and max(xs) / min(xs) > 10, columns=drawn)
    for label in labels:
        chart.lines[label] = {c: [] for c in chart.columns}
        chart.spread[label] = {}
        chart.missing[label] = []
        chart.capacity[label] = {c: [] for c in held}
    for i, ((_, row), label, at) in enumerate(zip(jobs, names, xs)):
        if row is None:
            chart.missing[label].append((at, statuses[i] if statuses else "failed"))
            continue
        for c in chart.columns:
            if not math.isnan(value := _number(row, c)):
                chart.lines[label][c].append((at, value))
            low, high = _number(row, c + SPREAD[0]), _number(row, c + SPREAD[1])
            if not (math.isnan(low) or math.isnan(high)):
                chart.spread[label].setdefault(c, []).append((at, low, high))
        for c in held:
            if not math.isnan(cap := _number(row, capacity_of(c))):
                chart.capacity[label][c].append((at, cap))
    for label in labels:
        for points in (*chart.lines[label].values(), *chart.spread[label].values(), chart.missing[label],
                       *chart.capacity[label].values()):
            points.sort(key=lambda p: p[0])
    return chart


def plot_sweep(jobs: list[tuple[str, Row | None]], path: Path, title: str,
               settings: list[dict[str, str]] | None = None, statuses: list[str] | None = None) -> bool:
    """A sweep's results, one panel per numeric result (:func:`drawn_columns`). Where the
    sweep varies a numeric setting (``settings``: each job's overrides, key to value), each
    result against that setting's value (:func:`sweep_lines`), else a bar per job.
    ``jobs``: (label, {column: (value, format[, unit])}), or (label, None) for a job without
    results (``statuses``: why, by default "failed"), marked as such. False where there is
    nothing to draw (no numeric result)."""
    chart = sweep_lines(jobs, settings, statuses) if settings else None
    if chart is not None and chart.columns:
        _plot_lines(chart, [row for _, row in jobs if row is not None], path, title)
        return True
    return _plot_bars(jobs, path, title, statuses)


def _plot_lines(chart: SweepLines, rows: list[Row], path: Path, title: str) -> None:
    """:func:`sweep_lines`' chart: a panel per result, a line with markers per line of the chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator
    from matplotlib.transforms import blended_transform_factory

    wide = min(3, len(chart.columns))
    high = -(-len(chart.columns) // wide)
    fig, axes = plt.subplots(high, wide, figsize=(4.2 * wide, 2.8 * high + 1.0), squeeze=False)
    values = sorted({p[0] for line in chart.lines.values() for pts in line.values() for p in pts}
                    | {p[0] for pts in chart.missing.values() for p in pts})
    for i, ax in enumerate(axes.flat):
        if i >= len(chart.columns):
            ax.axis("off")
            continue
        column = chart.columns[i]
        marked: dict[float, int] = {}  # jobs without results marked at each x so far: stacked, not drawn over
        for n, (label, line) in enumerate(chart.lines.items()):
            color = f"C{n}"
            points = line[column]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=4, lw=1.2,
                    color=color, label=label or None)
            if spread := chart.spread[label].get(column):  # the per-step spread, 10th to 90th percentile
                ax.vlines([p[0] for p in spread], [p[1] for p in spread], [p[2] for p in spread], color=color, lw=1)
            if capacity := chart.capacity[label].get(column):  # what it is held against, dashed
                ax.plot([p[0] for p in capacity], [p[1] for p in capacity], ls="--", lw=1, color=color, alpha=0.6)
            # a job without results, at its x along the panel's foot: a gap in the line is not a result
            at_foot = blended_transform_factory(ax.transData, ax.transAxes)
            for where, why in chart.missing[label]:
                height = 0.04 + 0.12 * marked.get(where, 0)
                marked[where] = marked.get(where, 0) + 1
                ax.plot([where], [height], marker="x", markersize=7, color=color, transform=at_foot, clip_on=False)
                ax.text(where, height + 0.045, why, transform=at_foot, ha="center", fontsize=6, color=color)
        if chart.log_x:
            ax.set_xscale("log")
        if len(values) <= 12:  # the values swept, as given, not the scale's round numbers
            ax.set_xticks(values, [f"{v:g}" for v in values])
            ax.xaxis.set_minor_locator(NullLocator())
        shown = [p[1] for line in chart.lines.values() for p in line[column]]
        shown += [p[1] for caps in chart.capacity.values() for p in caps.get(column, [])]
        shown += [p[2] for spreads in chart.spread.values() for p in spreads.get(column, [])]  # the whiskers' tops
        if shown and all(v >= 0 for v in shown):
            # from 0, a change read against the whole, as the bars do; above the highest point,
            # so that a result at its capacity is not drawn on the panel's frame
            ax.set_ylim(0, max(shown) * 1.1 or 1.0)
        unit = next((row[column][2] for row in rows if column in row and len(row[column]) > 2), "")
        spread_said = ", per-step 10th-90th percentile" if any(chart.spread[k].get(column) for k in chart.spread) else ""
        ax.set_title(f"{column}{f' ({unit})' if unit else ''}{spread_said}", fontsize=9 if not spread_said else 8)
        ax.set_xlabel(chart.x, fontsize=8)
        ax.tick_params(labelsize=7)
    handles = [Line2D([], [], marker="o", color=f"C{n}", label=label) for n, label in enumerate(chart.lines) if label]
    if any(chart.missing.values()):
        handles.append(Line2D([], [], marker="x", ls="", color="gray", label="no results (failed, stopped or not run)"))
    if any(points for caps in chart.capacity.values() for points in caps.values()):
        handles.append(Line2D([], [], ls="--", color="gray", label="capacity (the whole device or node)"))
    if handles:
        fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.07 if handles else 0, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


# at most this many panels to a row of the bar chart; more wrap onto the next row
BAR_PANELS = 4


def bar_columns(rows: list[Row]) -> list[str]:
    """A sweep chart's panels (:func:`drawn_columns`); a capacity is drawn on its result, on its
    bars or as a dashed line, not given a panel of its own."""
    columns = drawn_columns(rows)
    return [c for c in columns if not is_capacity(c, columns)]


def _plot_bars(jobs: list[tuple[str, Row | None]], path: Path, title: str, statuses: list[str] | None = None) -> bool:
    """A bar per job (a row each, labelled by what sets it apart) in a panel per result, its
    value written beside it; a result's ``<column> p10``/``p90`` as whiskers on its bar. The
    panels wrap onto rows of :data:`BAR_PANELS`."""
    rows = [row for _, row in jobs if row is not None]
    names = list(dict.fromkeys(c for row in rows for c in row))
    spread = {c for c in names if c.endswith(SPREAD) and c[: -len(SPREAD[0])] in names}
    columns = bar_columns(rows)
    if not rows or not columns:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # at most BAR_PANELS panels to a row: seven side by side were a strip 2060 px wide, 224 high
    wide = min(BAR_PANELS, len(columns))
    high = -(-len(columns) // wide)
    fig, axes = plt.subplots(high, wide, figsize=(2.9 * wide + 2.4, (0.42 * len(jobs) + 1.0) * high + 0.6),
                             sharey=True, squeeze=False)
    for ax in axes.flat[len(columns):]:
        ax.axis("off")
    y = list(range(len(jobs)))[::-1]
    # bars coloured by a text result that sets jobs apart in a few values (whose model gave a
    # plan's times, which are not on one scale; the sharding types; a setting not used)
    texts = {c: [str(row[c][0]) for row in rows if c in row] for c in names if c not in columns and c not in spread
             and not any(_numeric(row.get(c, ("",))[0]) for row in rows)}
    keyed = sorted((len(set(v)), c) for c, v in texts.items() if 1 < len(set(v)) <= 6 and len(v) == len(rows))
    key = keyed[0][1] if keyed else None
    kinds = list(dict.fromkeys(str(row[key][0]) for row in rows)) if key else []
    colors = [f"C{kinds.index(str(row[key][0]))}" if key and row is not None else "C0" for _, row in jobs]

    marked = False  # a capacity marked on some bar (said in the legend)
    for ax, column in zip(axes.flat, columns):
        numbers = [_number(row, column) for _, row in jobs]
        ax.barh(y, [0.0 if math.isnan(n) else n for n in numbers], color=colors)
        low, high = ([_number(row, column + end) for _, row in jobs] for end in SPREAD)
        whiskers = [(yi, lo, hi) for yi, lo, hi in zip(y, low, high) if not (math.isnan(lo) or math.isnan(hi))]
        if whiskers:  # the per-step spread, 10th to 90th percentile
            ax.hlines([w[0] for w in whiskers], [w[1] for w in whiskers], [w[2] for w in whiskers],
                      color="black", linewidth=1)
        # a result held against a capacity (memory): the capacity marked on each bar's row, and
        # the axis to it, so 76 of 1,536 GiB is not drawn as most of the axis
        caps = [_number(row, capacity_of(column)) for _, row in jobs]
        held = [(yi, c) for yi, c in zip(y, caps) if not math.isnan(c)]
        if held:
            ax.plot([c for _, c in held], [yi for yi, _ in held], marker="|", markersize=12, ls="", color="black")
            marked = True
        top = max([n for n in numbers + [w[2] for w in whiskers] + [c for _, c in held] if not math.isnan(n)],
                  default=1.0) or 1.0
        for j, ((_, row), yi, n) in enumerate(zip(jobs, y, numbers)):
            # the value as the row gives it: a count stays a whole number ("2", not "2.0")
            missing = f" {statuses[j] if statuses else 'failed'}"
            said = missing if row is None else " n/a" if math.isnan(n) else f" {format(row[column][0], row[column][1])}"
            ax.text(0 if math.isnan(n) else n, yi, said, va="center", fontsize=7)
        ax.set_xlim(0, top * 1.45)
        unit = next((row[column][2] for row in rows if column in row and len(row[column]) > 2), "")
        spread_said = ", per-step 10th-90th percentile" if whiskers else ""
        # a long title on two lines: "fullest rank device memory without the reserve" ran into the next panel's
        ax.set_title(textwrap.fill(f"{column}{f' ({unit})' if unit else ''}{spread_said}", 44),
                     fontsize=9 if not whiskers else 8)
        ax.tick_params(labelsize=7)  # the job labels too, on each row's first panel
    axes[0][0].set_yticks(y, [label for label, _ in jobs], fontsize=7)  # shared: each row's first panel says them
    handles, said = [], []
    if key:
        from matplotlib.patches import Patch

        handles += [Patch(color=f"C{i}") for i in range(len(kinds))]
        said += [f"{key}: {k or '-'}" for k in kinds]
    if marked:  # an unlabelled tick read as anything
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], marker="|", markersize=10, ls="", color="black"))
        said.append("capacity (the whole device or node)")
    if handles:
        fig.legend(handles, said, loc="lower center", ncol=len(handles), fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.06 if handles else 0, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
