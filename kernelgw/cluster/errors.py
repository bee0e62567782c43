"""What goes wrong between gateways, as the gateway's own errors (JSON at the edge)."""

from __future__ import annotations

from kernelgw.errors import KernelGWError


class OwnerGone(KernelGWError):
    """The session's gateway is not live (no fresh heartbeat, or it does not
    answer): its kernel may still run, and comes back when that gateway
    restarts and reattaches it."""

    status_code = 503
    code = "owner_gone"


class ForwardRefused(KernelGWError):
    """A request claimed to come from a peer gateway without a valid proof
    (another ``cluster_secret``, a replay, or no cluster here)."""

    status_code = 403
    code = "forward_refused"


class ClusterMisconfigured(KernelGWError):
    """The session runs on another gateway of the same store, and this one has no
    ``cluster_secret``, so it can neither forward there nor prove a forward: a
    setting to fix, not a session that does not exist."""

    status_code = 503
    code = "cluster_misconfigured"
