"""kernelgw's own face, `/v1`: sessions, executions over REST and WebSocket, files,
packages and history. A sibling of the Jupyter face (`server/jupyter/`) over the
same runtime; ownership, limits, audit and durability live below both."""
