"""The kernel's entry point: ipykernel with high-water marks fit for floods.

ZMQ's default send HWM (1000 messages per peer) makes the kernel's PUB socket
drop output silently when a cell prints or displays faster than the gateway
reads for a moment (10,000 displays lost about 5% of them). The gateway
receives with a 100,000 HWM; the kernel now sends with the same. Memory for a
queue this long counts against the container's own limit.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

SEND_HWM = 100_000


def main() -> None:
    # as ipykernel_launcher: no imports from the working directory (/workspace)
    if sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
        del sys.path[0]

    import zmq
    from ipykernel.kernelapp import IPKernelApp

    class KernelApp(IPKernelApp):  # type: ignore[misc]
        def _bind_socket(self, s: Any, port: int) -> Any:
            # before bind: HWMs apply to the pipes created after they are set
            s.setsockopt(zmq.SNDHWM, SEND_HWM)
            s.setsockopt(zmq.RCVHWM, SEND_HWM)
            return super()._bind_socket(s, port)

    KernelApp.launch_instance()


if __name__ == "__main__":
    main()
