"""The systems kernelgw is compared with in bench_peers.py, each behind one interface.

- `base`: what a peer returns for a cell (`Output`) and the `Peer` interface
  (start, run, stop, the containers it runs in).
- `trace`: the 10-turn data-analysis trace and the check of every turn's output.
- `limits`: the limits a container runs under, read from ``docker inspect``.
- `jupyter_ws`: a small synchronous Jupyter channels client (the stock Kernel Gateway).
- `images`: the offline image the Kernel-Gateway-based peers run from.
- `adapters`: one class per peer.

`base`, `trace`, `limits` and `jupyter_ws` import nothing beyond the standard
library at import time: tests/unit/test_bench_peers.py runs them in CI without
Docker or the peers' packages.
"""
