"""Storage: sessions, execution history and notebook notes.

SQLite (a file under the gateway's data directory) by default; PostgreSQL when
``database_url`` says so. `Store` implements the `kernelgw.runtime.recorder.Recorder`
protocol, so the session manager hands it every session start, finished
execution and session end, and it answers the history queries behind notebook
export and restore. The schema is upgraded to the head revision at every
start (`kernelgw.storage.migrate`, revisions in ``migrations/``).

Modules: ``store`` (the façade), ``writer`` (the batched write queue),
``database`` (set-up and recovery), ``cleanup`` (after a predecessor, and the
purge), ``engine`` (URLs, engines), ``kernels`` (reattach rows), ``queries``
(history reads), ``retention``, ``health``, ``keys``, ``audit``, ``schema``.

May import: ``kernelgw.runtime`` (the Recorder seam and its read-only views),
``kernelgw.events``, ``kernelgw.config``, ``kernelgw.keys``, ``kernelgw.errors``.
Never the HTTP layer, the SDK or the CLI; the runtime never imports storage.
"""

from kernelgw.storage.records import ExecutionRecord, NoteRecord, SessionRecord
from kernelgw.storage.store import Store, database_url_for

__all__ = ["ExecutionRecord", "NoteRecord", "SessionRecord", "Store", "database_url_for"]
