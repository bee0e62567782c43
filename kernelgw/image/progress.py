"""One-line progress notes of a build on the console (stderr for the CLI)."""

from __future__ import annotations

from rich.console import Console


def say(console: Console, msg: str) -> None:
    console.print(f"[bold cyan]kernelgw image[/]: {msg}", highlight=False)
