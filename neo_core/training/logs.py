"""The run's ``logs/metrics.csv``: one row per logged step, counted over the whole run.

Lightning's CSV logger deletes an existing ``metrics.csv`` when a run starts and writes rows
every 100 steps: a run resumed after a crash lost the earlier segments' rows, and a crash lost
the rows not yet written. :class:`RunLog` keeps the file and appends each row as it is logged;
a resumed run first drops the rows of steps after its checkpoint (logged by a run that
stopped without saving them), so every step appears once. The steps are the run's (0-based,
as Lightning numbers them): the training loop's step counter starts at the checkpoint's step
(``neo_core/training/run.py``).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

from lightning.fabric.loggers.csv_logs import _ExperimentWriter
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment


def keep_rows_before(log_csv: Path, step: int) -> None:
    """Drop the rows of ``log_csv`` at or after 0-based ``step`` (the steps after a checkpoint
    taken once ``step`` steps had finished); rows without a step stay."""
    if not log_csv.is_file():
        return
    with log_csv.open(newline="") as fh:
        reader = csv.DictReader(fh)
        columns = list(reader.fieldnames or [])
        rows = [r for r in reader if r.get("step", "") in ("", None) or int(float(r["step"])) < step]
    tmp = log_csv.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(log_csv)


class _AppendingWriter(_ExperimentWriter):
    """Lightning's writer, keeping an existing file."""

    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir)
        if os.path.isfile(self.metrics_file_path):  # its columns, so appended rows line up
            with open(self.metrics_file_path, newline="") as fh:
                reader = csv.DictReader(fh)
                columns, rows = list(reader.fieldnames or []), list(reader)
            self.metrics_keys = sorted(columns)  # Lightning appends in sorted column order
            if columns != self.metrics_keys:
                self._rewrite_rows(rows)

    def _rewrite_rows(self, rows: list[dict[str, Any]]) -> None:
        tmp = self.metrics_file_path + ".tmp"
        with open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=self.metrics_keys, restval="")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, self.metrics_file_path)

    def _check_log_dir_exists(self) -> None:  # Lightning's deletes metrics.csv here
        pass

    def log_hparams(self, params: dict[str, Any]) -> None:  # the run's config.json holds them
        pass


class RunLog(CSVLogger):
    """``<save_dir>/logs/metrics.csv``, appended to over a run's resumed segments; rows are
    written as they are logged (``flush_every`` steps)."""

    def __init__(self, save_dir: str | Path, flush_every: int = 1) -> None:
        super().__init__(str(save_dir), name="logs", version="", flush_logs_every_n_steps=max(1, flush_every))

    @property
    @rank_zero_experiment
    def experiment(self) -> _AppendingWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(self.log_dir)
        return self._experiment
