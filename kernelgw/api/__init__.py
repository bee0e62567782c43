"""The HTTP and WebSocket surface of the gateway (FastAPI)."""

from kernelgw.api.app import create_app

__all__ = ["create_app"]
