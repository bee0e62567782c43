"""kernelgw for agent frameworks: LangChain, MCP, and plain tool-calling APIs.

* `kernelgw.integrations.observation` -- what a model sees of one execution
  (pure, no extra dependencies);
* `kernelgw.integrations.tools` -- JSON tool definitions for OpenAI- and
  Anthropic-style function calling and a runner for their tool calls (no extra
  dependencies);
* `kernelgw.integrations.langchain` -- a LangChain tool (``pip install 'kernelgw[langchain]'``);
* `kernelgw.integrations.mcp` -- an MCP server, ``kernelgw mcp`` (``pip install 'kernelgw[mcp]'``).

Nothing here is imported by ``import kernelgw``; the modules that need an extra
raise an `ImportError` that names it when it is missing.

May import: the SDK (``kernelgw.client``) and the shared top-level modules;
never the server, runtime, storage or image builder: an agent talks to a gateway
over HTTP like any other client.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import ``module`` or raise an `ImportError` that says which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{feature} needs the '{module}' package, which is not installed: pip install 'kernelgw[{extra}]'"
        ) from exc
