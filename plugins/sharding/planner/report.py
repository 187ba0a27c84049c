"""Plan outputs: plan.json, plan.txt and a PNG chart of per-rank cost by kind."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from neo_core.checks import counted
from neo_core.errors import ConfigError
from neo_core.sharding import PlanResult, RankReport

# one colour per kind of time in every chart (memory bars: gray for device, brown for host)
KIND_COLORS = {
    "compute_fwd": "tab:blue", "compute_bwd": "tab:orange", "optimizer": "tab:green", "comm_input": "tab:red",
    "comm_fwd": "tab:purple", "comm_bwd": "tab:pink", "comm_allreduce": "tab:cyan", "comm_latency": "tab:olive",
    "prefetch": "navy",
}
OTHER_COLORS = ("gold", "teal", "crimson", "indigo", "lime", "salmon")


def chart_ranks(result: PlanResult, max_ranks: int = 128) -> list[RankReport]:
    """The ranks a chart draws, in rank order: all, or past ``max_ranks`` the slowest and the
    fullest (those the text report names)."""
    if isinstance(max_ranks, bool) or not isinstance(max_ranks, int) or max_ranks < 1:
        raise ConfigError(f"max_ranks={max_ranks!r}: a chart draws at least 1 rank; give a whole number, 1 or more.")
    if len(result.ranks) <= max_ranks:
        return list(result.ranks)
    fullest = result.fullest_rank()
    chosen = result.slowest_ranks(max_ranks)
    if fullest not in chosen:
        chosen[-1] = fullest
    return sorted(chosen, key=lambda r: r.rank)


def settings_line(result: PlanResult) -> str:
    """The cache and the compression a plan was made with, where set ("cache lru 0.2,
    compression fp16/fp32"; "" with neither), for a chart's title: charts of runs that differ
    in them alone are told apart by it."""
    settings = result.settings or {}
    said = []
    cache = settings.get("cache") or {}
    if isinstance(cache, dict) and isinstance(cache.get("load_factor"), (int, float)):
        said.append(f"cache {cache.get('name')} {cache['load_factor']:g}"
                    + (" with prefetch pipeline" if cache.get("prefetch_pipeline") else ""))
    comp = settings.get("compression") or {}
    if isinstance(comp, dict) and comp.get("name") not in (None, "none"):
        said.append(f"compression {comp.get('forward', '?')}/{comp.get('backward', '?')}")
    return ", ".join(said)


def chart_title(result: PlanResult, shown: int | None = None) -> str:
    """A plan chart's title, a line each: the planner, ranks, step (whose times: two planners'
    charts side by side are on one scale only if this matches) and imbalance, with ``shown``
    ranks of more drawn; the cache and compression where set (:func:`settings_line`); the
    cluster; the key to its assumed figures."""
    shown = len(result.ranks) if shown is None else shown
    source = f" ({result.times_from})" if result.times_from else ""
    return (
        f"{result.planner}: {counted(len(result.ranks), 'rank')}, step {result.predicted_step_time * 1e3:.3f} ms"
        f"{source}, imbalance {result.imbalance:.2f}"
        + (f" ({shown} shown: the slowest and the fullest)" if shown < len(result.ranks) else "")
        + (f"\n{settings}" if (settings := settings_line(result)) else "")
        + (f"\n{cluster}" if (cluster := result.topology_summary()) else "")
        + (f"\n{note}" if (note := result.assumed_note()) else "")
    )


def save_chart(result: PlanResult, path: str | Path, max_ranks: int = 128) -> Path:
    """Stacked bars of each rank's predicted time by kind (ms), with memory use on top (device,
    and host where cached tables use it). Past ``max_ranks`` ranks, the slowest are drawn and the
    fullest (as the text report names them). A path without a suffix gets ``.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out = Path(path)
    if out.is_dir() or str(path).endswith(("/", os.sep)):  # a folder: the chart's usual name in it
        out.mkdir(parents=True, exist_ok=True)
        out = out / "plan.png"
    elif not out.suffix:
        out = out.with_name(out.name.rstrip(".") + ".png")
    fig = plt.figure()
    formats = fig.canvas.get_supported_filetypes()
    plt.close(fig)
    if out.suffix[1:].lower() not in formats:
        raise ConfigError(f"cannot draw a chart as {out.name}: {out.suffix} is not an image format here; choose "
                          f"one of {', '.join('.' + f for f in sorted(formats))} (e.g. {out.with_suffix('.png').name}).")
    ranks = chart_ranks(result, max_ranks)
    named = [k for k in KIND_COLORS if any(k in r.time for r in ranks)]
    others = sorted({k for r in ranks for k in r.time} - set(KIND_COLORS))
    colors = {**KIND_COLORS, **{k: OTHER_COLORS[n % len(OTHER_COLORS)] for n, k in enumerate(others)}}
    x = np.arange(len(ranks))
    fig, (ax_mem, ax) = plt.subplots(
        2, 1, figsize=(max(6.0, 0.12 * len(ranks) + 4), 6), sharex=True, height_ratios=(1, 3)
    )
    bottom = np.zeros(len(ranks))
    for kind in [*named, *others]:
        vals = np.array([r.time.get(kind, 0.0) * 1e3 for r in ranks])
        if vals.any():
            ax.bar(x, vals, bottom=bottom, label=kind, width=0.85, color=colors[kind])
            bottom += vals
    step = max(1, -(-len(ranks) // 16))  # rank numbers under the bars, at most 16 of them
    ax.set_xticks(x[::step], [str(r.rank) for r in ranks[::step]])
    ax.axhline(result.predicted_step_time * 1e3, color="k", lw=0.8, ls="--", label="slowest rank")
    per_node = result.devices_per_node()
    if 1 < per_node < len(result.ranks) and len(ranks) == len(result.ranks):  # every rank drawn: nodes marked
        for edge in range(per_node, len(ranks), per_node):
            ax.axvline(edge - 0.5, color="0.6", lw=0.6, ls=":")
            ax_mem.axvline(edge - 0.5, color="0.6", lw=0.6, ls=":")
    ax.set_xlabel("rank" + (f" (dotted lines: node boundaries, {per_node} ranks a node)"
                            if 1 < per_node < len(ranks) == len(result.ranks) else ""))
    ax.set_ylabel("predicted time per step (ms)")
    # legends right of the axes: bars fill the whole plot area
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0.0)
    use = np.array([r.memory_total / r.memory_capacity if r.memory_capacity else 0.0 for r in ranks])
    # host memory is a node's, shared by its ranks: each rank's bar is its node's fill
    used, cap = result.node_host_memory()
    fill = {n: used[n] / cap[n] if cap[n] else 0.0 for n in used}
    host = np.array([fill[r.rank // result.devices_per_node()] for r in ranks])
    if host.any():  # cached tables: device and host memory side by side
        ax_mem.bar(x - 0.21, use * 100, width=0.42, color="gray", label="device")
        ax_mem.bar(x + 0.21, host * 100, width=0.42, color="tab:brown", label="host (its node's)")
        ax_mem.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0.0)
        ax_mem.set_ylabel("memory %")
    else:
        ax_mem.bar(x, use * 100, width=0.85, color="gray")
        ax_mem.set_ylabel("device mem %")
    ax_mem.set_ylim(0, 100)
    title = chart_title(result, len(ranks))
    # wrapped to the figure's width (about 13 characters an inch at this size): a narrow
    # chart of few ranks cut the cluster's line off at both ends
    chars = int(fig.get_figwidth() * 13)
    fig.suptitle("\n".join(textwrap.fill(line, chars) for line in title.splitlines()), fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def save_all(result: PlanResult, folder: str | Path) -> dict[str, Path]:
    """Write plan.json, plan.txt and plan.png into ``folder``."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    result.save_json(out / "plan.json")
    (out / "plan.txt").write_text(result.format_text(max_tables=None, max_ranks=None) + "\n")
    return {"json": out / "plan.json", "text": out / "plan.txt", "chart": save_chart(result, out / "plan.png")}
