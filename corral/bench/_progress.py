"""Progress of a running benchmark, for the person at the terminal waiting for it.

A benchmark says what it is doing with :func:`step`: a phase, with a ``total`` when it
counts something (hosts started, turns run), advanced as it goes. ``corral bench`` shows the
steps as rich progress bars on stderr while stderr is a terminal (:func:`shown_on`), and
nowhere otherwise — a pipe, a file, CI — where the figures are all the output there is. With
nobody watching, a step costs a function call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

#: The bars on screen, while :func:`shown_on` runs; None: nobody watches.
_shown: Progress | None = None


class Step:
    """One phase of a benchmark, as :func:`step` yields it."""

    def __init__(self, task: TaskID | None) -> None:
        self._task = task

    def advance(self, n: int = 1) -> None:
        """``n`` more of the step's ``total`` are done."""
        if _shown is not None and self._task is not None:
            _shown.advance(self._task, n)


class _Count(ProgressColumn):
    """``done/total`` of a step that counts; nothing for one that does not."""

    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text("")
        return Text(f"{int(task.completed)}/{int(task.total)}", style="progress.download")


@contextlib.contextmanager
def step(description: str, total: int | None = None) -> Iterator[Step]:
    """A phase of the benchmark, shown as a bar (``total``) or a spinner while it runs."""
    if _shown is None:
        yield Step(None)
        return
    task = _shown.add_task(description, total=total)
    try:
        yield Step(task)
    finally:
        _shown.remove_task(task)


@contextlib.contextmanager
def shown_on(console: Console) -> Iterator[None]:
    """Show the steps run meanwhile on ``console`` if it is a terminal (else nothing)."""
    global _shown
    if not console.is_terminal:
        yield
        return
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        _Count(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with progress:
        _shown = progress
        try:
            yield
        finally:
            _shown = None
