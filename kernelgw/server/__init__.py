"""The gateway's HTTP and WebSocket surface (FastAPI): the app and its lifespan,
routes, WebSocket, authentication and admission (keys, quotas, rate limits, code
policy), notebook export, and the web page it serves.

May import: ``kernelgw.runtime``, ``kernelgw.storage``, ``kernelgw.image`` and the
shared top-level modules. Never ``kernelgw.client``, ``kernelgw.cli`` or
``kernelgw.integrations``.
"""

from kernelgw.server.app import create_app

__all__ = ["create_app"]
