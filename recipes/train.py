"""Train a recommendation model with Neo.

    python recipes/train.py                                  # this machine, defaults
    python recipes/train.py +topology=zionex                 # plan for ZionEX, emulated here
    python recipes/train.py -m kernel=fused,dense            # a sweep (Hydra multirun)
    python recipes/train.py trainer.max_steps=50 compression=fp16
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from neo_core.cli import check_group_options, config_groups, force_add_overrides, user_errors
from neo_core.config import register_plugin_options
from neo_core.errors import RunInterrupted

CONF = str(Path(__file__).resolve().parent.parent / "conf")
# train.yaml's config groups (topology is added with +topology=<option>)
GROUPS = ("topology", "sharding", "kernel", "cache", "compression", "model", "data", "trainer", "experiment")


@hydra.main(version_base="1.3", config_path=CONF, config_name="train")
def main(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig

    from neo_core.training.run import train

    config = OmegaConf.to_container(cfg, resolve=True)
    # an experiment file sets keys across groups; the run's record names which one it was
    config["experiment"] = HydraConfig.get().runtime.choices.get("experiment")  # type: ignore[index]
    try:
        with user_errors():
            metrics = train(config)  # type: ignore[arg-type]
    except RunInterrupted as exc:
        if exc.resume_dir is None:
            raise
        # the command to continue: this run's overrides (as typed: this recipe adds the ``++``
        # itself), resuming in its folder
        typed = [o.removeprefix("++") for o in HydraConfig.get().overrides.task]
        keep = [o for o in typed if not o.startswith(("trainer.resume=", "output_dir="))]
        command = " ".join(shlex.quote(a) for a in [*keep, "trainer.resume=true", f"hydra.run.dir={exc.resume_dir}"])
        launcher = "torchrun <its options> recipes/train.py" if "TORCHELASTIC_RUN_ID" in os.environ else (
            "python recipes/train.py")
        raise RunInterrupted(f"{exc.summary}; continue with: {launcher} {command}") from None
    return float(metrics.get("val_auc", float("nan")))


if __name__ == "__main__":
    with user_errors():
        register_plugin_options(CONF)
        check_group_options(sys.argv[1:], CONF, GROUPS, nullable=("experiment",))
    # experiment=null is its default already (Hydra refuses null as a group override)
    argv = [a for a in sys.argv[1:] if a not in ("experiment=null", "experiment=")]
    sys.argv = [sys.argv[0], *force_add_overrides(argv, config_groups(CONF, argv))]
    try:
        sys.exit(main())
    except KeyboardInterrupt as exc:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second one would interrupt the exit itself
        if os.environ.get("RANK", "0") != "0":  # under torchrun: rank 0 says it
            sys.exit(130)
        print(
            f"interrupted: {exc}" if isinstance(exc, RunInterrupted) else
            "interrupted: the last finished checkpoint, if any, is in the run's checkpoint/ folder; "
            "continue with trainer.resume=true",
            file=sys.stderr,
        )
        sys.exit(130)
