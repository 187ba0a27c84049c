"""A job's console transcript (``neo_core/training/console.py``): what the console shows, minus
progress bars, in the run's folder."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from neo_core.training.console import CONSOLE_LOG_ENV, console_log


def test_the_transcript_keeps_messages_and_drops_progress_bars(tmp_path: Path, capsys) -> None:
    log = tmp_path / "run.log"
    before = sys.stdout, sys.stderr
    with console_log(log):
        assert os.environ[CONSOLE_LOG_ENV] == str(log)  # spawned ranks add theirs
        print("plan: 26 tables")
        sys.stderr.write("\rEpoch 0:  10%|█         | 3/30 [00:00<00:01, 33.8it/s]")
        sys.stderr.write("\rEpoch 0: 100%|██████████| 30/30 [00:01<00:00, 30.0it/s, loss=0.5]\n")
        sys.stderr.write("\x1b[A\rValidation: |          | 0/? [00:00<?, ?it/s]\x1b[A\n")
        sys.stderr.write("\r                    \r")  # a bar cleared
        sys.stderr.write("\rcounting 1\rcounting 2\n")  # a redrawn line that is not a bar: its last state
        for n in range(3):  # a bar, then a note printed on its line before the bar ends it
            sys.stdout.write(f"\rValidation DataLoader 0: {50 * n}%|█    | {n}/2 [00:00<00:00, 140.91it/s]")
        sys.stdout.write("\x1b[Anote: every held-out label is 0\n")
        print("\x1b[1mwarning\x1b[0m: slow", file=sys.stderr)
        print()
        print("done: 30 steps", end="")  # no newline yet: written when the log closes
    assert CONSOLE_LOG_ENV not in os.environ and (sys.stdout, sys.stderr) == before
    assert log.read_text() == (
        "plan: 26 tables\ncounting 2\nnote: every held-out label is 0\nwarning: slow\n\ndone: 30 steps\n")
    shown = capsys.readouterr()
    assert "plan: 26 tables" in shown.out and "Epoch 0: 100%" in shown.err  # the console is untouched


def test_a_failure_leaving_the_job_is_kept_with_its_traceback(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("first segment\n")  # a resumed run's transcript follows the first one's
    with pytest.raises(ZeroDivisionError), console_log(log, append=True):
        print("step 1")
        1 / 0  # noqa: B018
    text = log.read_text()
    assert text.startswith("first segment\nstep 1\nTraceback (most recent call last):")
    assert text.rstrip().endswith("ZeroDivisionError: division by zero")


def test_an_interrupt_is_recorded_as_the_recipe_says(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    with pytest.raises(KeyboardInterrupt), console_log(log, lambda exc: "interrupted: continue with X"):
        raise KeyboardInterrupt
    assert log.read_text() == "interrupted: continue with X\n"


def test_a_long_bar_is_held_as_its_last_state_only(tmp_path: Path) -> None:
    """A bar redrawn on one line for a whole run keeps one state in memory, not every redraw."""
    from neo_core.training.console import _LineFile

    with (tmp_path / "run.log").open("w") as fh:
        lines = _LineFile(fh)
        for n in range(20_000):
            lines.write("out", f"\rEpoch 0:  10%|█         | {n}/20000 [00:01<00:00, 30.0it/s]")
        assert len(lines.partial["out"]) < 100
        lines.write("out", "\ndone\n")
    assert (tmp_path / "run.log").read_text() == "done\n"


def test_a_fresh_run_starts_its_transcript_anew_and_an_unwritable_folder_is_left_to_the_recipe(tmp_path) -> None:
    from neo_core.training.console import replace_earlier_transcript

    log = tmp_path / "run.log"
    log.write_text("an earlier run's\n")
    with console_log(log):
        print("this run's")
        replace_earlier_transcript()  # what train() calls as the run starts
    assert log.read_text() == "this run's\n"
    (tmp_path / "afile").write_text("")
    before = sys.stdout
    with console_log(tmp_path / "afile" / "run.log"):  # not a folder: no transcript, no error here
        assert sys.stdout is before


def test_an_earlier_runs_transcript_is_replaced_only_once_the_new_run_starts(tmp_path: Path) -> None:
    # a run refused in a folder it may not take over (an earlier run's checkpoint) used to
    # empty that run's transcript before saying so
    from neo_core.training.console import replace_earlier_transcript

    log = tmp_path / "train.log"
    log.write_text("the earlier run's plan\ninterrupted: continue with X\n")
    with console_log(log):
        print("error: the folder holds a checkpoint")  # refused: replace_earlier_transcript not reached
    kept = log.read_text().splitlines()
    assert kept[:2] == ["the earlier run's plan", "interrupted: continue with X"]
    assert kept[2].startswith("--- a new run in this folder, ") and kept[3:] == ["error: the folder holds a checkpoint"]
    with console_log(log):
        print("notes before the start")
        replace_earlier_transcript()
        replace_earlier_transcript()  # once only
        print("plan")
        with open(log, "a") as rank:  # a spawned rank appends its own lines
            rank.write("rank 0: step 1\n")
        print("done")
    assert log.read_text() == "notes before the start\nplan\nrank 0: step 1\ndone\n"
    with console_log(log, append=True):  # a resumed run follows the first one's, as before
        replace_earlier_transcript()
        print("resumed")
    assert log.read_text().endswith("done\nresumed\n") and "---" not in log.read_text()
    replace_earlier_transcript()  # outside a transcript: nothing to do


def test_the_training_bar_counts_to_the_steps_left() -> None:
    # over the synthetic stream (no set length) Lightning's bar read "3/?"
    from types import SimpleNamespace

    from neo_core.training.run import steps_bar

    bar = steps_bar()
    bar._trainer = SimpleNamespace(max_steps=40, global_step=15, num_training_batches=float("inf"))
    assert bar.total_train_batches == 25
    bar._trainer = SimpleNamespace(max_steps=40, global_step=0, num_training_batches=12)  # data that ends first
    assert bar.total_train_batches == 12
    bar._trainer = SimpleNamespace(max_steps=-1, global_step=0, num_training_batches=float("inf"))
    assert bar.total_train_batches == float("inf")


def test_a_run_refused_in_another_runs_folder_leaves_no_transcript_there(tmp_path: Path, capsys) -> None:
    # a dry run refused in a training folder left its plan.log, and a training run then took
    # the folder for a dry run's
    from neo_core.training.console import discard_transcript

    log = tmp_path / "plan.log"
    with console_log(log):
        print("note: before the check")
        discard_transcript()
        print("error: the folder holds a training run")
    assert not log.exists()
    assert capsys.readouterr().out == "note: before the check\nerror: the folder holds a training run\n"
    log.write_text("an earlier transcript\n")
    with console_log(log):
        print("refused")
        discard_transcript()
        print("after")
    assert log.read_text() == "an earlier transcript\n"
    discard_transcript()  # outside a transcript: nothing to do


def test_a_transcript_that_can_be_written_no_more_stops_with_one_warning_and_the_run_goes_on(capfd) -> None:
    # a full disk: the transcript's flush raised inside the run's error report and again at its
    # close, two tracebacks of its own after the run's error
    import errno

    from neo_core.training.console import _LineFile

    class Full(io.StringIO):
        name = "/full/train.log"

        def flush(self) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

    lines = _LineFile(Full())
    lines.write("out", "a line\n")  # no error: the transcript stops
    lines.write("err", "another\n")
    lines.close()
    assert lines.dropped
    assert capfd.readouterr().err.count("warning: /full/train.log can be written no more (No space left on device): "
                                        "the run's transcript stops here") == 1
