"""The labels kernelgw puts on what it makes in the Docker engine: a gateway
finds its kernels, stores and volumes by them (after a restart too)."""

LABEL_GATEWAY = "kernelgw.gateway"
"""On every container and volume (value: the gateway's name)."""
LABEL_SESSION = "kernelgw.session"
LABEL_KERNEL = "kernelgw.kernel"
LABEL_STORE = "kernelgw.store"
"""On a session's store container and volumes (value: the session id)."""
LABEL_UID = "kernelgw.uid"
"""On every container started for a session (its kernels and its store; value: the
host uid its processes run as): how the gateways of a host know which uids are held."""
