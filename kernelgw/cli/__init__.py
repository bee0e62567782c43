"""The ``kernelgw`` command. ``main`` holds the client commands (run, export, mcp)
and the server ones (serve, image build), which import the server lazily so the
client install can run them; ``admin`` holds keys and audit, which work on the
database directly.

May import anything in kernelgw; nothing imports it.
"""

from kernelgw.cli.main import main

__all__ = ["main"]
