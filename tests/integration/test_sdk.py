"""The SDK and the `kernelgw run` CLI against a real gateway.

`gateway_url` (e.g. ``"http://127.0.0.1:PORT"``) comes from conftest.py: a gateway
running on a real Docker engine with the kernel image.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from kernelgw.client import AsyncClient, AsyncSession, Client, Session, SessionInfo
from kernelgw.client.execution import ExecutionBuilder, ExecutionError
from kernelgw.errors import ClientError

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REPO = Path(__file__).resolve().parents[2]

PLOT = """\
%matplotlib inline
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9])
plt.show()
"""

THREE_LINES = """\
import time
for i in range(3):
    print(f"line {i}", flush=True)
    time.sleep(0.5)
"""


@pytest.fixture
def client(gateway_url: str) -> Iterator[Client]:
    with Client(gateway_url) as client:
        yield client


@pytest.fixture(scope="module")
def shared_session(gateway_url: str) -> Iterator[Session]:
    """One session for the tests that do not care about a fresh kernel."""
    with Client(gateway_url) as client, client.session() as session:
        yield session


@pytest.fixture
async def aclient(gateway_url: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(gateway_url) as client:
        yield client


# ------------------------------------------------------------------------ sync


def test_health(client: Client) -> None:
    assert client.health()["status"] in ("ok", "degraded")


def test_session_keeps_state_and_is_deleted_on_exit(client: Client) -> None:
    with client.session() as session:
        assert isinstance(session, Session)
        first = session.run("x = 41")
        assert first.ok, first.error
        assert first.text is None
        result = session.run("x + 1")
        assert result.ok and result.text == "42"
        assert result.execution_count == first.execution_count + 1
        assert session.info().id == session.id
        assert session.id in {s.id for s in client.list_sessions()}
    with pytest.raises(ClientError) as info:
        client.get_session(session.id)
    assert info.value.status_code == 404


def test_stdout_and_stderr(shared_session: Session) -> None:
    ex = shared_session.run("print('a'); import sys; print('b', file=sys.stderr)")
    assert ex.ok
    assert ex.stdout == "a\n"
    assert ex.stderr == "b\n"
    assert ex.events[-1].type == "done"


def test_matplotlib_plot_is_an_image(shared_session: Session) -> None:
    ex = shared_session.run(PLOT)
    assert ex.ok, ex.error
    assert ex.images, ex.events
    assert ex.images[0].startswith(PNG_MAGIC)
    assert ex._repr_png_() == ex.images[0]


def test_error(shared_session: Session) -> None:
    ex = shared_session.run("1/0")
    assert ex.status == "error" and not ex.ok
    assert ex.error is not None
    assert ex.error.ename == "ZeroDivisionError"
    with pytest.raises(ExecutionError) as info:
        ex.raise_for_error()
    assert info.value.ename == "ZeroDivisionError"
    assert any("ZeroDivisionError" in line for line in info.value.traceback)
    # The session survives its code's errors.
    assert shared_session.run("2 + 2").text == "4"


def test_stream_yields_output_live_and_ends_with_done(shared_session: Session) -> None:
    arrivals = []
    builder = ExecutionBuilder()
    for event in shared_session.stream(THREE_LINES):
        arrivals.append((time.monotonic(), event))
        builder.add(event)
    events = [event for _, event in arrivals]
    types = [event.type for event in events]
    assert types[-1] == "done" and types.count("done") == 1
    assert "stream" in types and types.index("stream") < types.index("done")
    assert len({event.execution_id for event in events}) == 1
    seqs = [event.seq for event in events if event.seq is not None]
    assert seqs == sorted(seqs)

    ex = builder.build()
    assert ex.ok and ex.stdout == "line 0\nline 1\nline 2\n"
    # Live: the first line arrived well before the cell finished (~1.5 s).
    first_stream = next(t for t, e in arrivals if e.type == "stream")
    done_at = arrivals[-1][0]
    assert done_at - first_stream > 0.5


def test_timeout(shared_session: Session) -> None:
    ex = shared_session.run("import time; time.sleep(30)", timeout=1)
    assert ex.status == "timeout"
    assert ex.reason
    with pytest.raises(ExecutionError) as info:
        ex.raise_for_error()
    assert info.value.status == "timeout"
    # Usable afterwards (possibly restarted: state_lost says so).
    assert shared_session.run("1 + 1").text == "2"


def test_restart_loses_state(client: Client) -> None:
    with client.session() as session:
        session.run("y = 1").raise_for_error()
        session.restart()
        ex = session.run("y")
        assert ex.error is not None and ex.error.ename == "NameError"


def test_unknown_session_is_a_404(client: Client) -> None:
    with pytest.raises(ClientError) as info:
        client.get_session("does-not-exist")
    assert info.value.status_code == 404

    ghost = Session(client, SessionInfo(id="does-not-exist", state="dead"))
    with pytest.raises(ClientError) as info:
        ghost.run("1")
    assert info.value.status_code == 404
    with pytest.raises(ClientError) as info:
        list(ghost.stream("1"))
    assert info.value.status_code == 404


# ----------------------------------------------------------------------- async


async def test_async_session_keeps_state(aclient: AsyncClient) -> None:
    async with aclient.session() as session:
        assert isinstance(session, AsyncSession)
        (await session.run("x = 41")).raise_for_error()
        ex = await session.run("x + 1")
        assert ex.text == "42"

        ex = await session.run("print('a'); import sys; print('b', file=sys.stderr)")
        assert (ex.stdout, ex.stderr) == ("a\n", "b\n")

        ex = await session.run("1/0")
        assert ex.error is not None and ex.error.ename == "ZeroDivisionError"
        with pytest.raises(ExecutionError):
            ex.raise_for_error()
    with pytest.raises(ClientError) as info:
        await aclient.get_session(session.id)
    assert info.value.status_code == 404


async def test_async_stream(aclient: AsyncClient) -> None:
    async with aclient.session() as session:
        events = [event async for event in session.stream(THREE_LINES)]
    types = [event.type for event in events]
    assert types[-1] == "done" and "stream" in types
    text = "".join(e.text for e in events if e.type == "stream" and e.name == "stdout")
    assert text == "line 0\nline 1\nline 2\n"


async def test_async_unknown_session_is_a_404(aclient: AsyncClient) -> None:
    with pytest.raises(ClientError) as info:
        await aclient.get_session("does-not-exist")
    assert info.value.status_code == 404


# ------------------------------------------------------------------------- CLI


def _kernelgw(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "kernelgw.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=REPO,
    )


def test_cli_run_prints_output_and_saves_images(gateway_url: str, tmp_path: Path) -> None:
    code = "print('hello from kernelgw')\n" + PLOT
    proc = _kernelgw("run", "--server", gateway_url, "--save-images", str(tmp_path), code)
    assert proc.returncode == 0, proc.stderr
    assert "hello from kernelgw" in proc.stdout
    images = sorted(tmp_path.glob("*.png"))
    assert images, proc.stdout
    assert images[0].read_bytes().startswith(PNG_MAGIC)
    assert str(images[0]) in proc.stdout


def test_cli_run_from_stdin_and_exit_codes(gateway_url: str) -> None:
    proc = _kernelgw("run", "--server", gateway_url, "-", stdin="6 * 7\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "42"

    proc = _kernelgw("run", "--server", gateway_url, "1/0")
    assert proc.returncode == 1
    assert "ZeroDivisionError" in proc.stderr


def test_cli_run_keep_then_reuse_the_session(gateway_url: str, client: Client) -> None:
    proc = _kernelgw("run", "--server", gateway_url, "--keep", "z = 5")
    assert proc.returncode == 0, proc.stderr
    session_id = proc.stderr.strip().rsplit(" ", 1)[-1]
    try:
        proc = _kernelgw("run", "--server", gateway_url, "--session", session_id, "print(z * 2)")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "10\n"
        client.get_session(session_id)  # --session does not delete it
    finally:
        client.get_session(session_id).delete(missing_ok=True)
