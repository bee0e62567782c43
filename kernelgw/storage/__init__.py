"""Storage: sessions, execution history and notebook notes.

SQLite (a file under the gateway's data directory) by default; PostgreSQL when
``database_url`` says so. `Store` implements the `kernelgw.runtime.recorder.Recorder`
protocol, so the session manager hands it every session start, finished
execution and session end, and it answers the history queries behind notebook
export and restore.
"""

from kernelgw.storage.records import ExecutionRecord, NoteRecord, SessionRecord
from kernelgw.storage.store import Store, database_url_for

__all__ = ["ExecutionRecord", "NoteRecord", "SessionRecord", "Store", "database_url_for"]
