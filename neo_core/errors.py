"""User-facing errors: each carries one sentence that says what is wrong and how to fix it."""

from __future__ import annotations


class NeoError(Exception):
    """Base class for errors meant for users; the CLI prints them without a traceback."""


class ConfigError(NeoError):
    """A configuration key or value is wrong (names the key and the fix)."""


class PluginError(NeoError):
    """A plugin is unknown, duplicated, or failed to load."""


class PluginClash(PluginError):
    """Two plugins (or a plugin and an option) share a name: the recipes refuse to start."""


class PlanningError(NeoError):
    """No valid sharding plan exists for the given tables and topology."""


class CalibrationError(NeoError):
    """A measurement of this machine failed or could not be stored."""


class CheckpointError(NeoError):
    """A checkpoint cannot be read or does not fit the run resuming from it."""


class TrainingError(NeoError):
    """Training ended without the results it must leave."""


class RankLost(TrainingError):
    """A rank ended without a Python error (a signal, an exit code), and so the run.
    ``resume_dir``: the run's folder where a checkpoint there can be continued (the recipe adds
    the command that continues it)."""

    def __init__(self, message: str, resume_dir: str | None = None) -> None:
        super().__init__(message)
        self.resume_dir = resume_dir


class RunInterrupted(KeyboardInterrupt):
    """Training stopped early on Ctrl-C, every rank after the same step (says where it saved).
    ``summary``: what stopped and where it saved; ``resume_dir``: the run's folder when a
    checkpoint there can be continued."""

    def __init__(self, summary: str, resume_dir: str | None = None) -> None:
        hint = f"; continue with trainer.resume=true hydra.run.dir={resume_dir}" if resume_dir else ""
        super().__init__(summary + hint)
        self.summary, self.resume_dir = summary, resume_dir
