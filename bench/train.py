"""Training throughput: samples/s of several configurations, as ratios to a baseline in the same run.

    .venv/bin/python bench/train.py                       # default: 150 steps each
    .venv/bin/python bench/train.py --steps 300 --json out.json

Each configuration is a full 2-rank run of recipes/train.py's path (spawned ranks, DMP,
Lightning), timed by the ranks over training steps after a 5-step warm-up. The baseline is
TorchRec's planner with the unfused (dense) kernel; ratios above 1 are faster than it.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from args import check_writable  # noqa: E402
from charts import train_chart  # noqa: E402

CONF = Path(__file__).resolve().parent.parent / "conf"

CONFIGS: dict[str, list[str]] = {
    "torchrec planner + dense kernel (baseline)": ["sharding=torchrec", "kernel=dense"],
    "torchrec planner + fused kernel": ["sharding=torchrec"],
    "neo planner + dense kernel": ["kernel=dense"],
    "neo planner + fused kernel (make train)": [],
    "neo planner + fused kernel + fp16 comms": ["compression=fp16"],
}


def run(overrides: list[str], steps: int, out: Path) -> dict[str, Any]:
    from neo_core.training.run import train

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[
                *overrides,
                f"trainer.max_steps={steps}",
                "trainer.progress_bar=false",
                "trainer.checkpoint=false",
                f"output_dir={out}",
            ],
        )
    return train(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if args.steps < 6:  # samples/s is timed after a 5-step warm-up
        parser.error(f"--steps {args.steps}: must be at least 6 (5 warm-up steps are not timed)")
    check_writable(parser, "--json", args.json)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, overrides) in enumerate(CONFIGS.items()):
            print(f"[{i + 1}/{len(CONFIGS)}] {name}", file=sys.stderr, flush=True)
            metrics = run(overrides, args.steps, Path(tmp) / str(i))
            results.append({"config": name, "overrides": overrides, **{
                k: metrics[k] for k in ("samples_per_sec", "val_auc", "steps", "world_size", "global_batch_size")
            }})
    base = results[0]["samples_per_sec"]
    print(f"\n{'configuration':<44} {'samples/s':>10} {'vs baseline':>12} {'val AUC':>8}")
    for r in results:
        r["ratio"] = r["samples_per_sec"] / base
        print(f"{r['config']:<44} {r['samples_per_sec']:>10,.0f} {r['ratio']:>11.2f}x {r['val_auc']:>8.4f}")
    print(f"\nmachine: {platform.machine()}, {platform.processor() or 'cpu'}, python {platform.python_version()}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        chart = train_chart(json.loads(args.json.read_text()), args.json.with_suffix(".png"))
        print(f"wrote {args.json} and {chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
