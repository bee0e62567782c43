"""The server runtime: kernels and the sessions around them.

Holds the kernel session (kernel link, execution queue, event fan-out), the
session manager and warm pool, the workspace file and package helpers, and the
backends that start kernel containers (``runtime.backends``: the ``Backend``
protocol and its Docker implementation).

May import: ``kernelgw.errors``, ``kernelgw.events``, ``kernelgw.models``,
``kernelgw.config``, ``kernelgw.keys``, ``kernelgw.image`` (its public API).
Never ``kernelgw.server``, ``kernelgw.storage``, ``kernelgw.client``,
``kernelgw.cli`` or ``kernelgw.integrations``: storage plugs in through the
``Recorder`` protocol, the HTTP layer sits on top.
"""
