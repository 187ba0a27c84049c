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
