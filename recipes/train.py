"""Train a recommendation model with Neo.

    python recipes/train.py                                  # this machine, defaults
    python recipes/train.py +topology=zionex                 # plan for ZionEX, emulated here
    python recipes/train.py -m kernel=fused,dense            # a sweep (Hydra multirun)
    python recipes/train.py trainer.max_steps=50 compression=fp16
"""

from __future__ import annotations

import contextlib
import math
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from neo_core.cli import (
    APPENDED_GROUPS,
    SweepFailures,
    as_typed,
    cache_keys_select_lru,
    check_command_line,
    check_group_options,
    check_not_a_sweep_under_torchrun,
    check_sweep_jobs,
    check_sweep_values,
    check_yaml_files,
    config_dir_shadows,
    config_dirs,
    config_groups,
    defaults_choices,
    flags_first,
    force_add_overrides,
    help_groups,
    launch_lines_as_typed,
    option_names,
    plugin_env_prefix,
    repeated_settings,
    script_command,
    select_by_name,
    task_overrides,
    user_errors,
)
from neo_core.config import register_plugin_options
from neo_core.errors import RankLost, RunInterrupted
from neo_core.run_folders import (
    check_run_dirs,
    hold_given_dirs,
    hold_job_folder,
    hold_jobs_before_hydra_writes,
    hold_run_folders,
    use_fresh_run_dirs,
)
from neo_core.training.console import console_log

CONF = str(Path(__file__).resolve().parent.parent / "conf")
# train.yaml's config groups (topology is added with +topology=<option>)
GROUPS = ("topology", "sharding", "kernel", "cache", "compression", "model", "data", "trainer", "experiment")


# recipes/plan.py's settings, which a training run has no use for (conf/ holds both recipes' groups)
PLAN_KEYS = ("plan_model", "batch_size_per_rank")


def check_plan_settings(argv: list[str]) -> None:
    """Name a dry run's setting (``plan_model=``, ``model=<table set>``) as recipes/plan.py's."""
    from neo_core.errors import ConfigError

    # a training model of a table set's name (a --config-dir's, a plugin) is that model
    table_sets = set(option_names(CONF, "plan_model", argv)) - set(option_names(CONF, "model", argv))
    for arg in argv:
        key, eq, value = arg.partition("=")
        key = key.lstrip("+")
        if not eq or key.startswith("-"):
            continue
        table_set = key == "model" and any(v.strip() in table_sets for v in value.split(","))
        if key.split(".")[0] in PLAN_KEYS or table_set:
            raise ConfigError(
                f"{arg.lstrip('+')} is a setting of recipes/plan.py, which plans a table set "
                f"({' | '.join(sorted(table_sets))}) for a cluster without training: python recipes/plan.py "
                f"+topology=zionex model=<table set>. recipes/train.py trains model=<dlrm | dcnv2> on data=synthetic "
                "(data.num_sparse, data.rows, ... size its tables; trainer.batch_size is the batch per rank)."
            )


# Hydra's config-folder flags as given (--config-dir ...): the command that continues a run needs them
CONFIG_FLAGS: list[str] = []
# the command line as typed: a sweep is continued with it
ARGV: list[str] = []
# the command that continues the run under way, for a second Ctrl-C that stops at once
CONTINUE: list[str] = []
OUTPUT_DIR: list[str] = []  # the run's folder, once Hydra has made it
NOTES: list[str] = []  # notes on the command line, printed when the run starts (so its train.log has them)
SWEEPING: list[bool] = []  # [True] in a sweep (-m)


def config_flags(argv: list[str]) -> list[str]:
    """The config-folder and config-name flags among ``argv``, with their values."""
    names = ("-cd", "--config-dir", "-cp", "--config-path", "-cn", "--config-name")
    out, take = [], False
    for arg in argv:
        if take:
            out.append(arg)
            take = False
        elif arg in names:
            out.append(arg)
            take = True
        elif arg.startswith(tuple(f"{n}=" for n in names)):
            out.append(arg)
    return out


# the jobs of a -m sweep (SweepFailures): their results side by side, the failed ones' messages
def sweep_row(metrics: dict) -> dict:
    """A finished job's results for the sweep's summary: quality, speed with its per-step
    spread (``<column> p10``/``p90``: folded into the speed's line and drawn as whiskers), the
    plan's predicted step, and what the speed is of (ranks, global batch, cached tables, the
    chosen settings the run did not use)."""
    if not metrics:
        return {}
    spread = metrics.get("samples_per_sec_p10_p90") or (math.nan, math.nan)
    predicted = metrics.get("predicted_step_time_s")
    return {
        "val AUC": (metrics.get("val_auc", math.nan), ".4f"), "val loss": (metrics.get("val_loss", math.nan), ".4f"),
        "samples/s": (metrics.get("samples_per_sec", math.nan), ",.0f"),
        "samples/s p10": (spread[0], ",.0f"), "samples/s p90": (spread[1], ",.0f"),
        "predicted step": (predicted * 1e3 if predicted is not None else math.nan, ".3f", "ms"),
        "predicted by": (metrics.get("predicted_by") or "", "s"),
        "steps": (metrics.get("steps"), ""), "ranks": (metrics.get("world_size"), ""),
        "global batch": (metrics.get("global_batch_size"), ","),
        "cached tables": (metrics.get("cached_tables"), ""),
        "not used": (", ".join(metrics.get("not_used") or []), "s"),
    }


SWEEP = SweepFailures(sweep_row)


def mixed_scales_note() -> str | None:
    """A sweep whose runs' predicted steps come from different models does not rank them."""
    scales = sorted({row["predicted by"][0] for _, row in SWEEP.done.values() if row.get("predicted by", ("",))[0]})
    if len(scales) < 2:
        return None
    return (f"note: these runs' predicted steps come from different models ({', '.join(scales)}), which are not "
            "on one scale: their samples/s, measured, are")


def _typed_overrides() -> list[str]:
    """This run's overrides as typed: this recipe adds the ``++`` itself."""

    return [as_typed(o) for o in task_overrides()]


def _sweep_job(config: dict) -> dict:
    """One job of a sweep (``SweepFailures.job``): a failure is reported and kept, the sweep goes on."""
    from hydra.core.hydra_config import HydraConfig

    from neo_core.errors import CheckpointError
    from neo_core.training.checkpoint import latest_checkpoint
    from neo_core.training.run import check_not_a_dry_run, finished_note, finished_unchanged, train

    out, num = Path(config["output_dir"]), HydraConfig.get().job.num
    from neo_core.training.console import discard_transcript
    from neo_core.training.interrupt import asked_as_it_finished

    if asked_as_it_finished():  # a Ctrl-C or SIGTERM as the job before finished: this one does not start
        discard_transcript()  # its folder gets no train.log
        raise RunInterrupted(f"stopped as job #{num - 1} finished, before job #{num} started",
                             resume_dir=str(out))
    trainer = config.get("trainer") or {}
    if trainer.get("resume") is True:  # a continued sweep: a job stopped before its first save starts afresh
        try:
            latest = latest_checkpoint(out / "checkpoint")
        except CheckpointError:
            latest = ()  # damaged: the job says so
        done = finished_unchanged(out, config) if latest is None else None
        if done is not None:  # finished without saving a checkpoint (trainer.checkpoint=false)
            print(finished_note(out, done["steps"], checkpoint=False))
            done = {k: (math.nan if v is None and k in ("val_auc", "val_loss") else v) for k, v in done.items()}
            SWEEP.finished(num, " ".join(_typed_overrides()), out, done)
            return done
        if latest is None:
            print(f"note: job #{num} saved no checkpoint in {out}; it starts from step 0")
            config = {**config, "trainer": {**trainer, "resume": False}}
    metrics = SWEEP.job(
        lambda: train(config),  # type: ignore[arg-type]
        out, num, " ".join(_typed_overrides()), passthrough=(RunInterrupted,),
        # another run's folder, or a dry run's (and its error.txt), is left as it is
        before=lambda: (hold_job_folder(out), check_not_a_dry_run(out)),
    )
    return {} if metrics is None else metrics


def check_job(config: dict[str, Any]) -> None:
    """What a job checks before it trains (its keys and values, the launch, its plugins, the
    model's tables, a checkpoint in its folder; where its compression sends fp8 or int8 over gloo,
    its plan), for every job of a sweep before the first starts."""
    from neo_core.config import validate
    from neo_core.training.run import build_parts, check_before_start, check_job_plan, resolve_launch

    run = validate(config)
    launch = resolve_launch(run)
    check_before_start(run, write=False)
    check_job_plan(build_parts(run, launch), launch)


def _continue_command(run_dir: str) -> str:
    """The command that continues this run (in a sweep: the sweep) from its checkpoint."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.get().mode == RunMode.MULTIRUN:
        # the sweep as typed, in its folder: finished jobs report their results, this one
        # resumes and the jobs after it start
        keep = [a for a in ARGV if not a.lstrip("+").startswith(("trainer.resume=", "hydra.sweep.dir="))]
        args = [*keep, "trainer.resume=true", f"hydra.sweep.dir={Path(run_dir).parent}"]
    else:  # this run's overrides, resuming in its folder
        keep = [o for o in _typed_overrides() if not o.startswith(("trainer.resume=", "output_dir="))]
        args = [*CONFIG_FLAGS, *keep, "trainer.resume=true", f"hydra.run.dir={run_dir}"]
    here = HydraConfig.get().runtime.cwd  # where the command was typed (a job may run elsewhere)
    launcher = f"torchrun <its options> {script_command(__file__, here, python=False)}" if (
        "TORCHELASTIC_RUN_ID" in os.environ) else script_command(__file__, here)
    return f"{plugin_env_prefix()}{launcher} {' '.join(shlex.quote(a) for a in args)}"


def experiment_replaced(choices: dict[str, Any], argv: list[str], config: dict[str, Any] | None = None) -> list[str]:
    """Notes for the groups the chosen experiment selects, and the keys it sets (compared with
    the run's ``config``), that the command line set otherwise (the command line wins, as in
    Hydra)."""
    name = choices.get("experiment")
    files = [d / "experiment" / f"{name}.yaml" for d in reversed(config_dirs(CONF, argv))] if name else []
    found = next((f for f in files if f.is_file()), None)
    if found is None:  # none chosen, or a plugin's
        return []
    notes = []
    content: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(found))  # type: ignore[assignment]

    def leaves(node: Any, prefix: str) -> Any:
        for key, value in node.items():
            if isinstance(value, dict):
                yield from leaves(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    for key, value in leaves({k: v for k, v in content.items() if k != "defaults"}, ""):
        here: Any = config
        for part in key.split("."):
            here = here.get(part) if isinstance(here, dict) else None
        if config is not None and here != value:
            notes.append(f"note: {key}={here} on the command line replaces experiment {name}'s {key}={value}")
    for group, option in defaults_choices(content):
        if group in choices and option is not None and choices[group] != option:
            notes.append(f"note: {group}={choices[group]} on the command line replaces experiment "
                         f"{name}'s {group}={option}")
    return notes


def interrupted_message(exc: KeyboardInterrupt) -> str:
    """The line an interrupted run ends with: where its checkpoint is, how to continue."""
    if isinstance(exc, RunInterrupted):
        return f"interrupted: {exc}"
    if not OUTPUT_DIR:  # stopped before Hydra gave the run its folder
        return "interrupted before the run started: nothing was written"
    from neo_core.training.checkpoint import readable_checkpoint

    latest = readable_checkpoint(Path(OUTPUT_DIR[0]) / "checkpoint")
    if latest is None and SWEEPING:  # the sweep's command: finished jobs report, this one starts afresh
        return f"interrupted: no checkpoint of this job was saved in {OUTPUT_DIR[0]}; continue the sweep with: {CONTINUE[0]}"
    if latest is None:
        return (f"interrupted: no checkpoint was saved in {OUTPUT_DIR[0]}; run the command again to start "
                "over (trainer.checkpoint_every_n_steps=<n> saves during training)")
    return f"interrupted: the last finished checkpoint is at step {latest[1]} in {latest[0]}; " + (
        f"continue with: {CONTINUE[0]}" if CONTINUE else "continue with trainer.resume=true")


@hydra.main(version_base="1.3", config_path=CONF, config_name="train")
def main(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig

    from neo_core.training.run import continues_earlier_run, train

    with user_errors():  # a ${...} that does not resolve (an unset environment variable) named by its key
        config = OmegaConf.to_container(cfg, resolve=True)
    # an experiment file sets keys across groups; the run's record names which one it was
    config["experiment"] = HydraConfig.get().runtime.choices.get("experiment")  # type: ignore[index]
    CONTINUE[:] = [_continue_command(str(config["output_dir"]))]  # type: ignore[index]
    OUTPUT_DIR[:] = [str(config["output_dir"])]  # type: ignore[index]
    SWEEPING[:] = [True] if HydraConfig.get().mode == RunMode.MULTIRUN else []
    rank0 = os.environ.get("RANK", "0") == "0"  # under torchrun, rank 0 keeps the transcript
    if rank0:  # one run at a time in a folder (and one sweep in a sweep's)
        with user_errors():
            hold_run_folders(config["output_dir"])  # type: ignore[index]
    log = Path(config["output_dir"]) / "train.log"  # type: ignore[index]
    # the transcript of a run going on from a checkpoint follows the earlier one's
    resuming = continues_earlier_run(log.parent, bool(config["trainer"].get("resume")), config)  # type: ignore[index, union-attr, arg-type]
    with console_log(log, interrupted_message, append=resuming) if rank0 else contextlib.nullcontext():
        for note in NOTES if rank0 else ():
            print(note, file=sys.stderr)
        for note in experiment_replaced(dict(HydraConfig.get().runtime.choices), ARGV, config) if rank0 else ():  # type: ignore[arg-type]
            print(note)
        try:
            if HydraConfig.get().mode == RunMode.MULTIRUN:
                with user_errors():  # a sweep the config asks for (hydra.mode) gets here unchecked
                    check_not_a_sweep_under_torchrun(["-m"])
                metrics = _sweep_job(config)
            else:
                with user_errors():
                    try:
                        metrics = train(config)  # type: ignore[arg-type]
                    except RankLost as exc:  # a rank killed: the error says how to continue
                        # the run is over: a stop request now (a preemption's SIGTERM just after the kill)
                        # could only cut its last line, or end it by the signal rather than its status
                        for sig in (signal.SIGINT, signal.SIGTERM):
                            signal.signal(sig, signal.SIG_IGN)
                        if exc.resume_dir is None:
                            raise
                        raise RankLost(f"{exc}; continue with: {_continue_command(exc.resume_dir)}") from None
                from neo_core.training.interrupt import asked_as_it_finished

                if asked_as_it_finished():
                    print("note: the stop request came as the run was finishing; it finished and its results "
                          "are complete")
        except RunInterrupted as exc:
            if exc.resume_dir is None:
                raise
            raise RunInterrupted(f"{exc.summary}; continue with: {_continue_command(exc.resume_dir)}") from None
    return float(metrics.get("val_auc", float("nan")))


if __name__ == "__main__":
    sys.argv[1:] = flags_first(sys.argv[1:])
    CONFIG_FLAGS[:] = config_flags(sys.argv[1:])
    ARGV[:] = sys.argv[1:]
    try:
        with user_errors():
            check_command_line(sys.argv[1:], "recipes/train.py")
            check_not_a_sweep_under_torchrun(sys.argv[1:])
            register_plugin_options(CONF)  # loads the plugins, torch and TorchRec with them
            check_yaml_files(CONF, sys.argv[1:])
            for warning in config_dir_shadows(CONF, sys.argv[1:]):
                print(warning, file=sys.stderr)
            check_plan_settings(sys.argv[1:])
            check_group_options(sys.argv[1:], CONF, GROUPS, nullable=("experiment",))
            for note in repeated_settings(sys.argv[1:]):
                print(note, file=sys.stderr)
            check_sweep_values(sys.argv[1:], "recipes/train.py")
            check_run_dirs(sys.argv[1:])
            hold_given_dirs(sys.argv[1:])
            use_fresh_run_dirs()
            argv = select_by_name(sys.argv[1:], CONF, GROUPS)
            # cache.<key> without a cache policy: cache=lru, as recipes/plan.py
            argv, note = cache_keys_select_lru(argv, CONF, "train", "training")
            NOTES[:] = [note] if note else []
            typed = list(sys.argv[1:])
            OmegaConf.register_new_resolver("neo_train_groups", lambda: help_groups(CONF, GROUPS, typed), replace=True)
    except KeyboardInterrupt:  # a traceback through the libraries' imports said nothing more
        print(interrupted_message(KeyboardInterrupt()), file=sys.stderr)
        sys.exit(130)
    # experiment=null is its default already (Hydra refuses null as a group override)
    argv = [a for a in argv if a.lstrip("+") not in ("experiment=null", "experiment=")]
    selected = [g for g in GROUPS if g not in APPENDED_GROUPS]
    sys.argv = [sys.argv[0], *force_add_overrides(argv, config_groups(CONF, argv), selected)]
    check_sweep_jobs(check_job)  # a -m sweep: every job before the first starts
    launch_lines_as_typed()
    hold_jobs_before_hydra_writes()
    try:
        main()
        from neo_core.training.interrupt import asked_as_it_finished

        if asked_as_it_finished():  # the last job of a sweep (a single run says so itself)
            print("note: the stop request came as the last job was finishing; it finished, and so did the sweep")
        SWEEP.exit(mixed_scales_note)
    except KeyboardInterrupt as exc:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second one would interrupt the exit itself
        if os.environ.get("RANK", "0") != "0":  # under torchrun: rank 0 says it, and the first rank of each machine
            if os.environ.get("LOCAL_RANK") == "0":  # (another machine's log showed only torchrun's exit code)
                print(f"{interrupted_message(exc)} (rank {os.environ['RANK']}, this machine's first, stopped with "
                      "the others)", file=sys.stderr)
            sys.exit(130)
        if SWEEPING and SWEEP.folders:  # the finished jobs' results so far, and summary.csv
            with contextlib.suppress(Exception):  # the message below matters more
                SWEEP.summary(stopped=max(SWEEP.folders))
        print(interrupted_message(exc), file=sys.stderr)
        sys.exit(130)
