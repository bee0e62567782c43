"""E2B's API on the gateway, so E2B's SDKs run unchanged against kernelgw: the
control plane (sandboxes under ``/e2b``) and the sandbox traffic (the code
interpreter's ``/execute`` and ``/contexts``, envd's ``/health``), each sandbox
one kernelgw session. A sibling of `/v1` (`server/v1/`) and the Jupyter face
(`server/jupyter/`) over the same runtime."""
