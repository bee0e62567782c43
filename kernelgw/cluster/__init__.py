"""Many gateways as one service: a registry of live gateways in the shared
store, proofs between gateways, where a session's requests go, where a new
session is placed.

A kernel lives on the host whose engine runs its container, and its gateway
owns it (the session row's ``gateway_name``). Gateways that share one
PostgreSQL and one ``cluster_secret`` heartbeat into ``kgw_gateways``
(`registry`); a request for a session another live gateway owns is forwarded
there, signed (`proof`), by ``kernelgw.server.forward``. This package holds no
HTTP layer: the server imports it, never the other way round.
"""
