"""The orchestrator's view of a run: tail the label party's metrics into a progress bar."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class RunProgress:
    """epoch/step, loss and the latest test metric, as a rich progress bar."""

    def __init__(self, title: str, console: Console | None = None, enabled: bool = True) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("epoch {task.fields[epoch]}"), TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[metric]}"), TimeElapsedColumn(),
            console=console, disable=not enabled)
        self.task = self.progress.add_task(title, total=None, epoch="-", loss="-", metric="")
        self.last_eval: dict[str, Any] | None = None

    def __enter__(self) -> RunProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind == "plan":
            self.progress.update(self.task, total=record["total_train_steps"])
        elif kind == "train":
            self.progress.update(self.task, completed=record["step"] + 1,
                                 epoch=record["epoch"] + 1, loss=f"{record['loss']:.4f}")
        elif kind == "eval":
            self.last_eval = record
            self.progress.update(self.task, metric=format_eval(record))


def format_eval(record: dict[str, Any]) -> str:
    if record.get("test_auc") is not None:
        return f"test AUC {record['test_auc']:.4f}"
    return f"test acc {record['test_accuracy']:.4f}"
