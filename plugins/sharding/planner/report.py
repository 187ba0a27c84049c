"""Plan outputs: plan.json, plan.txt and a PNG chart of per-rank cost by kind."""

from __future__ import annotations

from pathlib import Path

from neo_core.sharding import PlanResult


def save_chart(result: PlanResult, path: str | Path, max_ranks: int = 128) -> Path:
    """Stacked bars of each rank's predicted time by kind (ms), with memory use on top (device,
    and host where cached tables use it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ranks = result.ranks[:max_ranks]
    kinds = sorted({k for r in ranks for k in r.time}, key=lambda k: (k.startswith("comm"), k))
    x = np.arange(len(ranks))
    fig, (ax_mem, ax) = plt.subplots(
        2, 1, figsize=(max(6.0, 0.12 * len(ranks) + 4), 6), sharex=True, height_ratios=(1, 3)
    )
    bottom = np.zeros(len(ranks))
    for kind in kinds:
        vals = np.array([r.time.get(kind, 0.0) * 1e3 for r in ranks])
        if vals.any():
            ax.bar(x, vals, bottom=bottom, label=kind, width=0.85)
            bottom += vals
    ax.axhline(result.predicted_step_time * 1e3, color="k", lw=0.8, ls="--", label="slowest rank")
    ax.set_xlabel("rank")
    ax.set_ylabel("predicted time per step (ms)")
    # legends right of the axes: bars fill the whole plot area
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0.0)
    use = np.array([r.memory_total / r.memory_capacity if r.memory_capacity else 0.0 for r in ranks])
    host = np.array(
        [sum(r.host_memory.values()) / r.host_memory_capacity if r.host_memory_capacity else 0.0 for r in ranks]
    )
    if host.any():  # cached tables: device and host memory side by side
        ax_mem.bar(x - 0.21, use * 100, width=0.42, color="gray", label="device")
        ax_mem.bar(x + 0.21, host * 100, width=0.42, color="tab:brown", label="host")
        ax_mem.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0.0)
        ax_mem.set_ylabel("memory %")
    else:
        ax_mem.bar(x, use * 100, width=0.85, color="gray")
        ax_mem.set_ylabel("device mem %")
    ax_mem.set_ylim(0, 100)
    ax_mem.set_title(
        f"{result.planner}: {len(result.ranks)} ranks, step {result.predicted_step_time * 1e3:.3f} ms, "
        f"imbalance {result.imbalance:.2f}"
        + (f" (first {len(ranks)} ranks shown)" if len(ranks) < len(result.ranks) else ""),
        fontsize=9,
    )
    fig.tight_layout()
    out = Path(path)
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
