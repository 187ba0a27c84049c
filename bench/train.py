"""Training throughput: samples/s of several configurations, as ratios to a baseline in the same run.

    .venv/bin/python bench/train.py                       # default: 150 steps each
    .venv/bin/python bench/train.py --steps 300 --json out.json

Each configuration is a full 2-rank run of recipes/train.py's path (spawned ranks, DMP,
Lightning), timed by the ranks over training steps after a 5-step warm-up. The baseline is
TorchRec's planner with the unfused (dense) kernel; ratios above 1 are faster than it.
"""

from __future__ import annotations

import argparse
import contextlib
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


def plan_of(out: Path) -> dict[str, Any]:
    """What a run's plan.json says of the plan: its types, and where the topology's figures came
    from (a calibration of this machine changes the plan and so the throughput)."""
    plan = json.loads((out / "plan.json").read_text())
    types = next((n for n in plan.get("notes", []) if n.startswith("types: ")), "")
    sources = plan.get("topology", {}).get("sources") or {}
    # the file, its date and the ranks that measured it; a plan.json of before that entry names the file only
    measured = sorted(v for v in sources.values() if v.startswith("measured"))
    said = sources.get("calibration") or (measured[0] if measured else None)
    return {"plan": types.removeprefix("types: "), "calibration": said}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="training steps per configuration (default 150)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep each configuration's run folder (plan, metrics, its printed output in run.log) "
                             "under this folder; by default they go to a temporary folder, removed at the end")
    args = parser.parse_args(argv)
    if args.steps < 6:  # samples/s leaves out the first steps
        parser.error(f"--steps {args.steps}: must be at least 6 (samples/s leaves out the warm-up steps)")
    check_writable(parser, "--json", args.json)
    if args.keep is not None and args.keep.exists() and (not args.keep.is_dir() or any(args.keep.iterdir())):
        parser.error(f"--keep {args.keep}: {'the folder is not empty' if args.keep.is_dir() else 'a file'}; "
                     "give a new folder")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        for i, (name, overrides) in enumerate(CONFIGS.items()):
            out = root / str(i)
            out.mkdir(parents=True)
            print(f"[{i + 1}/{len(CONFIGS)}] {name} ...", file=sys.stderr, flush=True)
            try:
                with open(out / "run.log", "w") as log, contextlib.redirect_stdout(log):  # its plan and notes
                    metrics = run(overrides, args.steps, out)
            except BaseException:  # what it printed is needed to see why: not left in a removed folder
                print((out / "run.log").read_text(), end="", file=sys.stderr)
                raise
            for line in (out / "run.log").read_text().splitlines():  # what bears on the figures
                if line.startswith("warning:") or (line.startswith("note: ") and "core(s)" in line):
                    print(f"    {line}", file=sys.stderr)
            results.append({"config": name, "overrides": overrides, **{
                k: metrics.get(k) for k in ("samples_per_sec", "samples_per_sec_p10_p90", "val_auc", "steps",
                                            "world_size", "global_batch_size")
            }, **plan_of(out)})
            print(f"    {metrics['samples_per_sec']:,.0f} samples/s, val AUC {metrics['val_auc']:.4f}, plan "
                  f"{results[-1]['plan']}" + (f" (run folder {out})" if args.keep else ""), file=sys.stderr, flush=True)
    base = results[0]["samples_per_sec"]
    print(f"\n{'configuration':<44} {'samples/s':>10} {'per step p10-p90':>18} {'vs baseline':>12} {'val AUC':>8}")
    for r in results:
        r["ratio"] = r["samples_per_sec"] / base
        spread = r.get("samples_per_sec_p10_p90")  # how steady each run was: ratios inside it are noise
        steady = f"{spread[0]:,.0f}-{spread[1]:,.0f}" if spread else "-"
        print(f"{r['config']:<44} {r['samples_per_sec']:>10,.0f} {steady:>18} {r['ratio']:>11.2f}x {r['val_auc']:>8.4f}")
    print(f"\nmachine: {platform.machine()}, {platform.processor() or 'cpu'}, python {platform.python_version()}")
    calibrations = sorted({r["calibration"] or "none (the local topology's defaults)" for r in results})
    print(f"calibration: {', '.join(calibrations)}: it changes Neo's plans (the plan column of the JSON)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        chart = train_chart(json.loads(args.json.read_text()), args.json.with_suffix(".png"))
        print(f"wrote {args.json} and {chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
