"""Jupyter's kernels API on the gateway: the REST API (`rest`) and the channels
WebSocket (`channels`), so Jupyter clients (jupyter_server ``--gateway-url``,
JupyterLab, scripts) drive kernelgw sessions as Jupyter kernels."""
