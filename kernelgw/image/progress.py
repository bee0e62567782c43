"""One-line progress notes of a build on the console (stderr for the CLI)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


def say(console: Console, msg: str) -> None:
    console.print(f"[bold cyan]kernelgw image[/]: {msg}", highlight=False)


def spinner(console: Console) -> Progress:
    """A one-line live display of a long step (its latest log line and the time
    it has taken), gone when the step ends."""
    return Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
