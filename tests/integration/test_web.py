"""The web page at ``/``, end to end: headless Chromium (Debian's, never a
downloaded one) driven by Playwright's sync API against the real gateway.

Screenshots go to ``<output_dir>/web/`` for people to look at.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from playwright.sync_api import (
    BrowserContext,
    Locator,
    Page,
    Request,
    WebSocket,
    WebSocketRoute,
    expect,
    sync_playwright,
)

from kernelgw.keys import parse_key
from tests.integration.conftest import (
    RunningGateway,
    gateway_settings,
    run,
    start_gateway,
)
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.integration

FINISHED = re.compile(r"^(ok|error|timeout|interrupted|dead|refused)$")

expect.set_options(timeout=30_000)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserContext]:
    """One headless Chromium with a fresh profile; each test opens its own pages."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"No Chromium at {CHROMIUM}; run scripts/ensure-chromium.sh", pytrace=False)
    os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1280, "height": 900},
            accept_downloads=True,
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture(scope="module")
def shots(output_dir: Path) -> Path:
    path = output_dir / "web"
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class Tab:
    """One browser tab showing the web page, with what its console said."""

    page: Page
    base_url: str
    console: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def new_session(self) -> str:
        self.page.goto(self.base_url + "/")
        self.page.click("#new-session")
        expect(self.page.locator("#conn-state")).to_have_text("live")
        sid = self.page.locator("#session-id").inner_text()
        assert re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", sid), sid  # a dashed UUID
        assert self.page.url.endswith(f"/?session={sid}")
        return sid

    def open(self, sid: str) -> None:
        self.page.goto(f"{self.base_url}/?session={sid}")
        expect(self.page.locator("#conn-state")).to_have_text("live")

    def submit(self, code: str) -> Locator:
        """Type code into the editor, press Shift+Enter; the new cell."""
        editor = self.page.locator("#code")
        editor.fill(code)
        editor.press("Shift+Enter")
        expect(editor).to_have_value("")
        last = self.page.locator(".cell").last
        execution_id = last.get_attribute("data-execution-id")
        assert execution_id and execution_id.startswith("web-")
        return self.cell(execution_id)

    def cell(self, execution_id: str) -> Locator:
        return self.page.locator(f'.cell[data-execution-id="{execution_id}"]')

    def run(self, code: str, status: str = "ok") -> Locator:
        cell = self.submit(code)
        expect(cell).to_have_attribute("data-status", FINISHED, timeout=90_000)
        assert cell.get_attribute("data-status") == status, cell.inner_text()
        return cell

    def shot(self, path: Path, full_page: bool = False) -> None:
        self.page.screenshot(path=str(path), full_page=full_page)


@pytest.fixture
def tabs(browser: BrowserContext, gateway: RunningGateway) -> Iterator[list[Tab]]:
    """Opens tabs on demand (``tabs_factory``); checks none raised a script error."""
    opened: list[Tab] = []
    yield opened
    for tab in opened:
        tab.page.close()
    errors = [e for tab in opened for e in tab.errors]
    assert not errors, f"uncaught errors in the page: {errors}"


def open_tab(browser: BrowserContext, base_url: str, opened: list[Tab]) -> Tab:
    page = browser.new_page()
    tab = Tab(page, base_url)
    page.on("console", lambda msg: tab.console.append(f"{msg.type}: {msg.text}"))
    page.on("pageerror", lambda exc: tab.errors.append(str(exc)))
    opened.append(tab)
    return tab


@pytest.fixture
def tab(browser: BrowserContext, gateway: RunningGateway, tabs: list[Tab]) -> Tab:
    return open_tab(browser, gateway.url, tabs)


def stdout_of(cell: Locator) -> str:
    return "".join(cell.locator(".stream-stdout").all_inner_texts())


# ---------------------------------------------------------------------- tests


def test_page_is_served_with_a_strict_content_security_policy(http: httpx.Client) -> None:
    resp = http.get("/")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    csp = resp.headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["script-src"] == "'self'"
    assert directives["default-src"] == "'none'"
    assert directives["frame-ancestors"] == "'none'"
    assert "<script>" not in resp.text and "onclick" not in resp.text
    for asset in ("app.js", "render.js", "style.css", "favicon.svg"):
        assert http.get(f"/static/{asset}").status_code == 200
    assert http.get("/static/../__init__.py").status_code == 404


def test_home_lists_sessions_and_opens_one(tab: Tab, http: httpx.Client, session_id: str, shots: Path) -> None:
    tab.page.goto(tab.base_url + "/")
    row = tab.page.locator("#sessions tbody tr", has_text=session_id)
    expect(row).to_be_visible()
    tab.shot(shots / "home.png")
    row.locator("a.btn").click()
    expect(tab.page.locator("#conn-state")).to_have_text("live")
    expect(tab.page.locator("#session-id")).to_have_text(session_id)


def test_output_streams_in_before_the_cell_ends(tab: Tab, shots: Path) -> None:
    tab.new_session()
    code = "import time\nfor i in range(6):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.5)"
    started = time.monotonic()
    cell = tab.submit(code)
    expect(cell.locator(".stream-stdout")).to_contain_text("tick 0", timeout=20_000)
    first_seen = time.monotonic() - started
    # the first line is on the page while the cell is still running
    assert cell.get_attribute("data-status") == "running"
    assert "tick 5" not in stdout_of(cell)
    tab.shot(shots / "stream-running.png")
    expect(cell).to_have_attribute("data-status", "ok", timeout=30_000)
    assert stdout_of(cell) == "".join(f"tick {i}\n" for i in range(6))
    assert time.monotonic() - started > first_seen + 1.5  # the rest came later, live
    expect(cell.locator(".prompt")).to_have_text("In [1]:")


def test_chart_dataframe_and_error_render(tab: Tab, shots: Path) -> None:
    tab.new_session()
    chart = tab.run(
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(figsize=(6, 3))\n"
        "ax.plot([1, 3, 2, 5], marker='o'); ax.set_title('a chart')\n"
        "plt.show()"
    )
    img = chart.locator("img.output-image")
    expect(img).to_be_visible()
    assert (img.get_attribute("src") or "").startswith("data:image/png;base64,")
    assert img.evaluate("i => i.complete && i.naturalWidth") > 100
    # the figure's structured chart, as a caption (not raw JSON)
    expect(chart.locator(".output-caption")).to_have_text("line chart \u201ca chart\u201d \u00b7 1 series")

    table = tab.run(
        "import pandas as pd\n"
        "df = pd.DataFrame({'city': ['Oslo', 'Lima', 'Pune'], 'temp': [4.5, 19.0, 27.25], 'rank': [3, 2, 1]})\n"
        "df"
    )
    frame_el = table.locator("iframe.output-html")
    expect(frame_el).to_be_visible()
    assert frame_el.get_attribute("sandbox") == ""  # isolated: no scripts, opaque origin
    frame = table.frame_locator("iframe.output-html")
    expect(frame.locator("table.dataframe")).to_be_visible()
    expect(frame.locator("table.dataframe th").first).to_be_attached()
    assert frame.locator("thead th").all_inner_texts()[1:] == ["city", "temp", "rank"]
    assert frame.locator("tbody tr").count() == 3
    expect(frame.locator("tbody")).to_contain_text("Lima")
    # the frame is sized to its content: the whole table is visible, not cut off
    outer = frame_el.bounding_box()
    inner = frame.locator("table.dataframe").bounding_box()
    assert outer and inner
    assert inner["y"] + inner["height"] <= outer["y"] + outer["height"] + 1, (inner, outer)
    assert outer["height"] < inner["height"] + 30, (inner, outer)
    expect(table.locator(".output-result")).to_have_attribute("data-prompt", "Out[2]")
    expect(table.locator(".output-caption")).to_have_text("data: 3 rows \u00d7 3 columns (city, temp, rank)")

    error = tab.run("def f(x):\n    return 1 / x\n\nf(0)", status="error")
    box = error.locator(".output-error")
    expect(box.locator(".error-title")).to_have_text("ZeroDivisionError: division by zero")
    traceback = box.locator(".traceback").inner_text()
    assert "Traceback (most recent call last)" in traceback
    assert "return 1 / x" in traceback and "f(0)" in traceback
    assert "\x1b" not in traceback  # ANSI colours became styles, not text
    assert box.locator(".traceback span[class*='ansi-fg']").count() > 0
    tab.page.set_viewport_size({"width": 1280, "height": 1400})
    tab.shot(shots / "overview.png")


def test_script_in_kernel_html_does_not_run_in_the_page(tab: Tab, shots: Path) -> None:
    tab.new_session()
    title = tab.page.title()
    cell = tab.run(
        "from IPython.display import HTML, display\n"
        "display(HTML(\"<script>console.log('pwned-log'); window.parent.document.title='pwned'; "
        "document.title='pwned'</script><b>bold</b>\"))\n"
        "display(HTML('<img src=x onerror=\"parent.document.title=\\'pwned-img\\'; console.log(\\'pwned-img\\')\">'"
        " '<a href=\"javascript:parent.document.title=1\">link</a><style>body{background:red}</style>'))"
    )
    frames = cell.locator("iframe.output-html")
    expect(frames).to_have_count(2)
    for i in range(2):
        sandbox = frames.nth(i).get_attribute("sandbox")
        assert sandbox is not None and "allow-scripts" not in sandbox and "allow-same-origin" not in sandbox
    expect(cell.frame_locator("iframe.output-html").first.locator("b")).to_have_text("bold")
    tab.page.wait_for_timeout(500)  # give any script that could run the time to do so
    assert tab.page.title() == title
    assert tab.page.evaluate("document.title") == title
    assert not [m for m in tab.console if "pwned" in m], tab.console
    # kernel HTML never entered the page's own DOM; its style did not leak out
    assert tab.page.locator("body > b, .cell-outputs > b, .cell-outputs script").count() == 0
    assert tab.page.evaluate("getComputedStyle(document.body).backgroundColor") != "rgb(255, 0, 0)"
    tab.shot(shots / "script-blocked.png")


def test_interrupt_a_running_cell_from_the_page(tab: Tab, shots: Path) -> None:
    tab.new_session()
    cell = tab.submit("import time\nprint('sleeping', flush=True)\ntime.sleep(120)")
    expect(cell.locator(".stream-stdout")).to_have_text("sleeping\n", timeout=20_000)
    interrupt = tab.page.locator("#interrupt")
    expect(interrupt).to_be_enabled()
    interrupt.click()
    expect(cell).to_have_attribute("data-status", "interrupted", timeout=30_000)
    expect(cell.locator(".output-error .error-title")).to_contain_text("KeyboardInterrupt")
    expect(interrupt).to_be_disabled()
    tab.shot(shots / "interrupted.png")
    after = tab.run("print('still here')")
    assert stdout_of(after) == "still here\n"


def test_restart_from_the_page(tab: Tab) -> None:
    tab.new_session()
    tab.run("x = 1")
    tab.page.once("dialog", lambda dialog: dialog.accept())
    tab.page.click("#restart")
    expect(tab.page.locator(".divider")).to_have_text("kernel restarted")
    cell = tab.run("print('x' in dir())")
    assert stdout_of(cell) == "False\n"
    expect(cell.locator(".prompt")).to_have_text("In [1]:")


def test_upload_through_the_page_and_read_it_in_a_cell(tab: Tab, tmp_path: Path, shots: Path) -> None:
    tab.new_session()
    local = tmp_path / "greeting.txt"
    local.write_text("hello from the browser\nsecond line\n")
    tab.page.set_input_files("#upload-input", str(local))
    expect(tab.page.locator("#file-list")).to_contain_text("greeting.txt")
    cell = tab.run("print(open('greeting.txt').read(), end='')")
    assert stdout_of(cell) == "hello from the browser\nsecond line\n"
    tab.shot(shots / "upload.png")


def test_download_artifacts_files_and_notebook(tab: Tab, tmp_path: Path) -> None:
    sid = tab.new_session()
    cell = tab.run("open('report.txt', 'w').write('made in a cell\\n')\nprint('written')")
    link = cell.locator(".artifacts a.file-link")
    expect(link).to_have_text("⬇ report.txt")
    with tab.page.expect_download() as info:
        link.click()
    assert info.value.suggested_filename == "report.txt"
    assert Path(info.value.path()).read_text() == "made in a cell\n"
    # the same file from the file list
    listed = tab.page.locator("#file-list a.file-link", has_text="report.txt")
    expect(listed).to_be_visible()
    with tab.page.expect_download() as info:
        listed.click()
    assert Path(info.value.path()).read_text() == "made in a cell\n"
    with tab.page.expect_download() as info:
        tab.page.click("#notebook")
    assert info.value.suggested_filename == f"kernelgw-{sid}.ipynb"
    notebook = json.loads(Path(info.value.path()).read_text())
    sources = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in notebook["cells"]]
    assert any("report.txt" in s for s in sources)


def test_two_tabs_watch_one_session_live(
    browser: BrowserContext, gateway: RunningGateway, tabs: list[Tab], shots: Path
) -> None:
    a = open_tab(browser, gateway.url, tabs)
    sid = a.new_session()
    a.run("x = 41\nprint('an earlier cell')")
    # a tab opened later shows the session's earlier cells (the replay buffer)
    b = open_tab(browser, gateway.url, tabs)
    b.open(sid)
    earlier = b.page.locator(".cell").first
    expect(earlier.locator(".stream-stdout")).to_have_text("an earlier cell\n")
    expect(earlier.locator(".cell-input")).to_contain_text("x = 41")
    expect(earlier).to_have_attribute("data-status", "ok")
    # a cell run in tab A streams into tab B while it runs
    cell_a = a.submit("import time\nfor i in range(6):\n    print(f'step {i}', flush=True)\n    time.sleep(0.5)")
    execution_id = cell_a.get_attribute("data-execution-id")
    assert execution_id
    cell_b = b.cell(execution_id)
    expect(cell_b.locator(".stream-stdout")).to_contain_text("step 0", timeout=20_000)
    assert cell_b.get_attribute("data-status") == "running"
    assert "step 5" not in stdout_of(cell_b)
    expect(cell_b.locator(".cell-input")).to_contain_text("print(f'step {i}'")
    expect(a.page.locator("#watchers")).to_have_text("2 watching", timeout=10_000)
    expect(cell_a).to_have_attribute("data-status", "ok")
    expect(cell_b).to_have_attribute("data-status", "ok")
    assert stdout_of(cell_a) == stdout_of(cell_b) == "".join(f"step {i}\n" for i in range(6))
    # and the other way round
    from_b = b.run("print(x + 1)")
    cell_in_a = a.cell(from_b.get_attribute("data-execution-id") or "")
    expect(cell_in_a.locator(".stream-stdout")).to_have_text("42\n")
    expect(cell_in_a.locator(".prompt")).to_have_text("In [3]:")
    a.shot(shots / "two-tabs-a.png")
    b.shot(shots / "two-tabs-b.png")


def test_reconnect_resumes_without_losing_or_repeating_events(tab: Tab, http: httpx.Client) -> None:
    sid = tab.new_session()
    tab.run("print('before the drop')")
    # drop the connection and keep it down for a while; meanwhile another client runs a cell
    tab.page.evaluate("() => { window.kernelgw.reconnectDelay = 3000; window.kernelgw.ws.close(); }")
    expect(tab.page.locator("#conn-state")).to_have_text("reconnecting")
    result = run(http, sid, "print('while the page was away')", execution_id="rest-while-away")
    assert result["status"] == "ok"
    expect(tab.page.locator("#conn-state")).to_have_text("live", timeout=15_000)
    missed = tab.cell("rest-while-away")
    expect(missed).to_have_attribute("data-status", "ok")
    assert stdout_of(missed) == "while the page was away\n"
    assert tab.page.locator(".cell").count() == 2
    after = tab.run("print('after the drop')")
    assert stdout_of(after) == "after the drop\n"
    assert tab.page.locator(".cell").count() == 3


def test_clear_output_and_update_display(tab: Tab) -> None:
    tab.new_session()
    cell = tab.run(
        "from IPython.display import display, clear_output\n"
        "import time\n"
        "h = display('first version', display_id=True)\n"
        "print('to be cleared', flush=True)\n"
        "time.sleep(0.3)\n"
        "clear_output()\n"
        "h = display('draft', display_id=True)\n"
        "print('kept')\n"
        "h.update('final version')"
    )
    text = cell.locator(".cell-outputs").inner_text()
    assert "to be cleared" not in text and "first version" not in text
    assert "'final version'" in text and "draft" not in text and "kept" in text
    # a display updated from a later cell
    later = tab.run("h.update('updated by a later cell')")
    expect(cell.locator(".cell-outputs")).to_contain_text("'updated by a later cell'")
    assert later.locator(".cell-outputs").inner_text().strip() == ""


def test_output_after_a_forged_end_is_shown_marked_late(tab: Tab, http: httpx.Client) -> None:
    sid = tab.new_session()
    cell = tab.run(
        "k = get_ipython().kernel\n"
        "p = k.get_parent()\n"
        "nonce = {key: {'status': 'ok', 'data': {'text/plain': expr}, 'metadata': {}}\n"
        "         for key, expr in p['content']['user_expressions'].items() if key == 'kernelgw_end'}\n"
        "reply = {'status': 'ok', 'execution_count': 9, 'user_expressions': nonce, 'payload': []}\n"
        "k.session.send(k.shell_stream, 'execute_reply', reply, parent=p, ident=k._parent_ident['shell'])\n"
        "k.session.send(k.iopub_socket, 'status', {'execution_state': 'idle'}, parent=p)\n"
        "import os, time\n"
        "deadline = time.monotonic() + 120\n"
        "while not os.path.exists('late-go') and time.monotonic() < deadline:\n"
        "    time.sleep(0.02)\n"
        "print('printed after the forged end')\n"
        "raise ValueError('raised after the forged end')"
    )  # the forged end: ok, nothing shown yet
    assert stdout_of(cell) == ""
    assert http.put(f"/v1/sessions/{sid}/files/late-go", content=b"go").status_code == 201
    expect(cell).to_have_attribute("data-status", "error", timeout=60_000)
    expect(cell.locator(".output-late")).to_have_text("⚠ sent after this execution had ended")
    assert stdout_of(cell) == "printed after the forged end\n"
    expect(cell.locator(".output-error")).to_contain_text("raised after the forged end")


def test_a_refused_cell_shows_the_gateways_message(tab: Tab) -> None:
    tab.new_session()
    too_big = "x = 1\n" + "#" * (1024 * 1024 + 10_000)  # over the gateway's max_code_bytes
    cell = tab.submit(too_big)
    expect(cell).to_have_attribute("data-status", "refused")
    expect(cell.locator(".cell-foot")).to_contain_text(re.compile(r"larger than the (gateway's )?limit"))
    expect(tab.page.locator("#conn-state")).to_have_text("live")  # the connection stays
    assert stdout_of(tab.run("print('fine')")) == "fine\n"


@pytest.fixture(scope="module")
def small_gateway(gateway: RunningGateway) -> Iterator[RunningGateway]:
    """A gateway with a tiny replay buffer and output cap."""
    gw = start_gateway(
        gateway_settings(gateway_name=f"{gateway.settings.gateway_name}w", replay_buffer=10, max_output_bytes=20_000)
    )
    yield gw
    gw.stop()


def test_truncated_output_is_marked(browser: BrowserContext, small_gateway: RunningGateway, tabs: list[Tab]) -> None:
    tab = open_tab(browser, small_gateway.url, tabs)
    tab.new_session()
    cell = tab.run("for i in range(2000):\n    print('y' * 50)\nprint('never shown')")
    expect(cell.locator(".output-note.warn")).to_be_visible()
    assert "never shown" not in stdout_of(cell)
    assert len(stdout_of(cell)) <= 20_000


def test_gap_is_filled_from_history_and_an_ended_session_shows_its_cells(
    browser: BrowserContext, small_gateway: RunningGateway, tabs: list[Tab], shots: Path
) -> None:
    """A session older than the replay buffer: the page asks the history for the rest."""
    with httpx.Client(base_url=small_gateway.url, timeout=120) as http:
        sid = http.post("/v1/sessions", json={}).json()["id"]
        for i in range(5):
            assert run(http, sid, f"print('cell {i}')")["status"] == "ok"
        tab = open_tab(browser, small_gateway.url, tabs)
        tab.open(sid)  # replay holds the last 10 of 20 events: a gap of 1..10 first
        cells = tab.page.locator(".cell")
        expect(cells).to_have_count(5)
        for i in range(5):
            expect(cells.nth(i).locator(".stream-stdout")).to_have_text(f"cell {i}\n")
            expect(cells.nth(i).locator(".cell-input")).to_have_text(f"print('cell {i}')")
            expect(cells.nth(i)).to_have_attribute("data-status", "ok")
            expect(cells.nth(i).locator(".prompt")).to_have_text(f"In [{i + 1}]:")
        live = tab.run("print('live')")
        assert stdout_of(live) == "live\n"
        # deleting the session ends the page's session; reopening shows the stored cells
        assert http.delete(f"/v1/sessions/{sid}").status_code == 204
        expect(tab.page.locator("#session-state")).to_have_text("ended", timeout=15_000)
        tab.page.reload()
        expect(tab.page.locator("#session-state")).to_have_text("ended", timeout=15_000)
        expect(tab.page.locator(".cell")).to_have_count(6)
        expect(tab.page.locator("#code")).to_be_disabled()
        expect(tab.page.locator("#banner")).to_contain_text("ended")
        tab.shot(shots / "ended-session.png")


# ------------------------------------------------- a gateway that requires keys
#
# Its own data_dir (its keys turn authentication on for it alone) and its own
# gateway_name; keys are made with the real `kernelgw keys` CLI on that data dir.

KEYED_DATA_DIR = Path(f"/tmp/kgwt-webkeys-{os.getpid()}")
WRONG_KEY = "kgw_000000000000_" + "A" * 43
KEY_STORAGE = "kernelgw.apiKey"


def keys_cli(*args: str) -> str:
    env = {**os.environ, "KERNELGW_DATA_DIR": str(KEYED_DATA_DIR)}
    env.pop("KERNELGW_API_KEY", None)
    proc = subprocess.run(
        [sys.executable, "-m", "kernelgw", "keys", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def new_key(name: str) -> dict[str, Any]:
    return json.loads(keys_cli("create", name, "--json"))  # type: ignore[no-any-return]


@dataclass
class KeyedGateway:
    gw: RunningGateway
    key: str  # the key "web" the browser is given
    other: str  # another user's key

    @property
    def url(self) -> str:
        return self.gw.url

    def client(self, key: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.gw.url, headers=headers, timeout=120)


@pytest.fixture(scope="module")
def keyed(docker_client: Any) -> Iterator[KeyedGateway]:
    shutil.rmtree(KEYED_DATA_DIR, ignore_errors=True)
    web, other = new_key("web"), new_key("other")
    gw = start_gateway(
        gateway_settings(gateway_name=f"webkeys{os.getpid()}", data_dir=str(KEYED_DATA_DIR), auth_cache_s=0.2)
    )
    try:
        yield KeyedGateway(gw, web["key"], other["key"])
    finally:
        gw.stop()
        left = docker_client.containers.list(
            all=True, filters={"label": f"kernelgw.gateway={gw.settings.gateway_name}"}
        )
        shutil.rmtree(KEYED_DATA_DIR, ignore_errors=True)
        assert not left, f"containers left behind: {[c.name for c in left]}"


@dataclass
class Traffic:
    """Every HTTP request and WebSocket a page made."""

    requests: list[Request] = field(default_factory=list)
    sockets: list[WebSocket] = field(default_factory=list)

    @property
    def ws_urls(self) -> list[str]:
        return [ws.url for ws in self.sockets]

    def api(self, method: str | None = None, path: str | None = None) -> list[Request]:
        return [
            r
            for r in self.requests
            if urlsplit(r.url).path.startswith("/v1/")
            and (method is None or r.method == method)
            and (path is None or urlsplit(r.url).path == path)
        ]


def watch(tab: Tab) -> Traffic:
    traffic = Traffic()
    tab.page.on("request", lambda r: traffic.requests.append(r))
    tab.page.on("websocket", lambda ws: traffic.sockets.append(ws))
    return traffic


def session_storage_key(tab: Tab) -> str | None:
    return tab.page.evaluate("k => sessionStorage.getItem(k)", KEY_STORAGE)  # type: ignore[no-any-return]


def give_key(tab: Tab, key: str) -> None:
    form = tab.page.locator("#auth-overlay")
    expect(form).to_be_visible()
    tab.page.fill("#api-key", key)
    tab.page.click("#auth-submit")


def sign_in(tab: Tab, key: str) -> None:
    tab.page.goto(tab.base_url + "/")
    give_key(tab, key)
    expect(tab.page.locator("#auth-overlay")).to_be_hidden()
    expect(tab.page.locator("#home")).to_be_visible()


def test_without_keys_the_page_asks_for_none(tab: Tab) -> None:
    traffic = watch(tab)
    tab.new_session()
    tab.run("print('no key')")
    expect(tab.page.locator("#auth-overlay")).to_be_hidden()
    expect(tab.page.locator("#auth-meta")).to_be_hidden()
    assert not traffic.api("POST", "/v1/auth/token")  # no tokens when the gateway wants none
    assert traffic.ws_urls and all("token=" not in url for url in traffic.ws_urls)
    assert all("authorization" not in r.all_headers() for r in traffic.api())
    assert session_storage_key(tab) is None


def test_keyed_gateway_asks_for_a_key_then_runs_cells_live(
    browser: BrowserContext, keyed: KeyedGateway, tabs: list[Tab], shots: Path
) -> None:
    tab = open_tab(browser, keyed.url, tabs)
    traffic = watch(tab)
    page = tab.page
    page.goto(keyed.url + "/")
    # the form, and nothing behind it asked the gateway for more than whoami
    overlay = page.locator("#auth-overlay")
    expect(overlay).to_be_visible()
    expect(overlay).to_contain_text("kernelgw keys create")
    assert page.locator("#api-key").get_attribute("type") == "password"
    expect(page.locator("#auth-error")).to_be_hidden()
    expect(page.locator("#home")).to_be_hidden()
    assert [urlsplit(r.url).path for r in traffic.api()] == ["/v1/auth/whoami"]
    tab.shot(shots / "key-form.png")

    # a wrong key: the gateway's own message, and the form again
    with keyed.client(WRONG_KEY) as c:
        refusal = c.get("/v1/auth/whoami").json()["error"]["message"]
    give_key(tab, WRONG_KEY)
    expect(page.locator("#auth-error")).to_contain_text(refusal)
    expect(overlay).to_be_visible()
    expect(page.locator("#api-key")).to_be_focused()
    assert session_storage_key(tab) is None
    tab.shot(shots / "key-refused.png")

    # the right key: a session, a cell, its output over a WebSocket opened with a token
    page.fill("#api-key", "")
    give_key(tab, keyed.key)
    expect(overlay).to_be_hidden()
    expect(page.locator("#auth-meta")).to_contain_text("web")
    assert session_storage_key(tab) == keyed.key
    sid = tab.new_session()
    cell = tab.submit("import time\nprint(6*7, flush=True)\ntime.sleep(2)\nprint('end')")
    expect(cell.locator(".stream-stdout")).to_have_text("42\n", timeout=20_000)
    assert cell.get_attribute("data-status") == "running"  # streamed live, before the cell ended
    expect(cell).to_have_attribute("data-status", "ok", timeout=30_000)
    assert stdout_of(cell) == "42\nend\n"
    assert any("token=" in url for url in traffic.ws_urls)
    tab.shot(shots / "key-session.png")
    # the session is this key's: the other key does not see it
    with keyed.client(keyed.other) as c:
        assert c.get(f"/v1/sessions/{sid}").status_code == 404

    # a reload keeps the key for this tab: no form, the session and its cell are back
    page.reload()
    expect(page.locator("#conn-state")).to_have_text("live")
    expect(overlay).to_be_hidden()
    expect(page.locator(".cell").first.locator(".stream-stdout")).to_have_text("42\nend\n")
    assert session_storage_key(tab) == keyed.key
    # a new tab is another sessionStorage: it asks again
    other_tab = open_tab(browser, keyed.url, tabs)
    other_tab.page.goto(f"{keyed.url}/?session={sid}")
    expect(other_tab.page.locator("#auth-overlay")).to_be_visible()
    assert session_storage_key(other_tab) is None

    # "forget key" clears it: the form again, nothing of the session on the page
    page.click("#forget-key")
    expect(overlay).to_be_visible()
    expect(page.locator("#auth-error")).to_be_hidden()
    expect(page.locator(".cell")).to_have_count(0)
    expect(page.locator("#auth-meta")).to_be_hidden()
    assert session_storage_key(tab) is None
    page.reload()
    expect(overlay).to_be_visible()
    # and giving it again carries on with the session in the URL
    give_key(tab, keyed.key)
    expect(page.locator("#conn-state")).to_have_text("live")
    expect(page.locator(".cell")).to_have_count(1)
    with keyed.client(keyed.key) as c:
        c.delete(f"/v1/sessions/{sid}")


def test_the_key_never_leaves_the_tab_except_as_a_header(
    browser: BrowserContext, keyed: KeyedGateway, tabs: list[Tab], tmp_path: Path
) -> None:
    tab = open_tab(browser, keyed.url, tabs)
    traffic = watch(tab)
    page = tab.page
    sign_in(tab, keyed.key)
    sid = tab.new_session()
    tab.run("open('out.txt', 'w').write('hi')\nprint('written')")
    # a dropped connection reconnects with a fresh token
    page.evaluate("() => window.kernelgw.ws.close()")
    expect(page.locator("#conn-state")).to_have_text("live", timeout=15_000)
    assert stdout_of(tab.run("print('again')")) == "again\n"
    # uploads and downloads carry the key as a header too
    local = tmp_path / "up.txt"
    local.write_text("uploaded\n")
    page.set_input_files("#upload-input", str(local))
    expect(page.locator("#file-list")).to_contain_text("up.txt")
    with page.expect_download() as info:
        page.locator("#file-list a.file-link", has_text="out.txt").click()
    assert Path(info.value.path()).read_text() == "hi"
    with page.expect_download() as info:
        page.click("#notebook")
    assert info.value.suggested_filename == f"kernelgw-{sid}.ipynb"
    assert "written" in Path(info.value.path()).read_text()
    page.reload()
    expect(page.locator("#conn-state")).to_have_text("live")

    key = keyed.key
    parsed = parse_key(key)
    assert parsed is not None
    secret = parsed[1]
    # every API request had the header, and no URL ever held the key
    api_requests = traffic.api()
    assert len(api_requests) > 10
    for r in api_requests:
        if urlsplit(r.url).path == "/v1/auth/whoami" and r.all_headers().get("authorization") is None:
            continue  # the very first question, before the user gave a key
        assert r.all_headers().get("authorization") == f"Bearer {key}", (r.method, r.url)
    assert any(r.method == "PUT" for r in api_requests)
    for url in [r.url for r in traffic.requests] + traffic.ws_urls + [page.url]:
        assert secret not in url, url
    # the WebSockets used tokens only, a fresh one fetched for each connect
    # (tokens made in the same second for the same key are identical: compare fetches)
    assert len(traffic.ws_urls) >= 3
    for url in traffic.ws_urls:
        query = parse_qs(urlsplit(url).query)
        assert set(query) == {"token", "last_seq"}, url
        assert query["token"][0] != key
    assert len(traffic.api("POST", "/v1/auth/token")) == len(traffic.ws_urls)
    # stored in this tab's sessionStorage only: not localStorage, cookies, the DOM or the console
    assert page.evaluate("() => localStorage.length") == 0
    assert page.evaluate("() => document.cookie") == ""
    assert session_storage_key(tab) == key
    assert page.evaluate("() => Object.keys(sessionStorage)") == [KEY_STORAGE]
    assert secret not in page.content()
    assert page.input_value("#api-key") == ""
    assert not [m for m in tab.console if secret in m]
    with keyed.client(key) as c:
        c.delete(f"/v1/sessions/{sid}")


def refuse_sockets(page: Page, refuse: list[int], code: int, reason: str) -> list[str]:
    """Routes the page's WebSockets: the first ``refuse[0]`` are closed with ``code``
    the way the gateway does it (accepted, then closed); the rest go through."""
    urls: list[str] = []

    def handler(ws: WebSocketRoute) -> None:
        urls.append(ws.url)
        if refuse[0] > 0:
            refuse[0] -= 1
            ws.close(code=code, reason=reason)
        else:
            ws.connect_to_server()

    page.route_web_socket(re.compile(r".*/ws\?.*"), handler)
    return urls


def test_a_refused_token_is_replaced_once_then_the_key_is_asked_for(
    browser: BrowserContext, keyed: KeyedGateway, tabs: list[Tab], shots: Path
) -> None:
    tab = open_tab(browser, keyed.url, tabs)
    page = tab.page
    traffic = watch(tab)
    refuse = [0]
    urls = refuse_sockets(page, refuse, 4401, "The token is invalid or expired")
    sign_in(tab, keyed.key)
    sid = tab.new_session()
    # one refusal: a fresh token and the connection comes back, with what was typed meanwhile
    refuse[0] = 1
    page.evaluate("() => { window.kernelgw.reconnectDelay = 1500; window.kernelgw.ws.close(); }")
    expect(page.locator("#conn-state")).to_have_text("reconnecting")
    cell = tab.submit("print('sent while away')")
    expect(cell).to_have_attribute("data-status", "ok", timeout=30_000)
    assert stdout_of(cell) == "sent while away\n"
    expect(page.locator("#auth-overlay")).to_be_hidden()
    assert len(urls) == 3
    assert len(traffic.api("POST", "/v1/auth/token")) == 3  # a new token for each connect
    # refused again after the fresh token too: the key form, with the gateway's reason
    refuse[0] = 2
    page.evaluate("() => window.kernelgw.ws.close()")
    expect(page.locator("#auth-overlay")).to_be_visible()
    expect(page.locator("#auth-error")).to_contain_text("The token is invalid or expired")
    expect(page.locator("#conn-state")).to_have_text("offline")
    assert len(urls) == 5
    assert len(traffic.api("POST", "/v1/auth/token")) == 5
    assert session_storage_key(tab) is None
    tab.shot(shots / "key-ws-refused.png")
    page.wait_for_timeout(1000)
    assert len(urls) == 5  # no more attempts while the form is up
    # the key again: connected, the cells are still there
    give_key(tab, keyed.key)
    expect(page.locator("#conn-state")).to_have_text("live")
    assert stdout_of(tab.run("print('back')")) == "back\n"
    assert page.locator(".cell").count() == 2
    with keyed.client(keyed.key) as c:
        c.delete(f"/v1/sessions/{sid}")


def test_a_revoked_key_brings_back_the_form(browser: BrowserContext, keyed: KeyedGateway, tabs: list[Tab]) -> None:
    doomed = new_key("doomed")
    tab = open_tab(browser, keyed.url, tabs)
    page = tab.page
    sign_in(tab, doomed["key"])
    tab.new_session()
    tab.run("x = 1")
    keys_cli("revoke", doomed["id"])
    # the gateway closes the live connection (4401), or the page's next request
    # (it polls the session) or reconnect is refused: the form, either way
    page.evaluate("() => window.kernelgw.ws?.close()")
    expect(page.locator("#auth-overlay")).to_be_visible(timeout=15_000)
    expect(page.locator("#auth-error")).to_contain_text("refused the key")
    assert session_storage_key(tab) is None


def test_another_keys_session_is_not_found(browser: BrowserContext, keyed: KeyedGateway, tabs: list[Tab]) -> None:
    with keyed.client(keyed.other) as c:
        sid = c.post("/v1/sessions", json={}).json()["id"]
        try:
            tab = open_tab(browser, keyed.url, tabs)
            tab.page.goto(f"{keyed.url}/?session={sid}")
            give_key(tab, keyed.key)
            expect(tab.page.locator("#session-state")).to_have_text("ended", timeout=15_000)
            expect(tab.page.locator("#banner")).to_contain_text(
                f"There is no session {sid} that this API key can see", timeout=15_000
            )
            expect(tab.page.locator("#code")).to_be_disabled()
            # and the other key's session was not touched
            assert c.get(f"/v1/sessions/{sid}").json()["state"] == "idle"
        finally:
            c.delete(f"/v1/sessions/{sid}")


def test_a_refused_origin_is_explained_not_retried(
    browser: BrowserContext, keyed: KeyedGateway, tabs: list[Tab]
) -> None:
    tab = open_tab(browser, keyed.url, tabs)
    page = tab.page
    urls = refuse_sockets(page, [100], 4403, "this origin may not open sessions")
    sign_in(tab, keyed.key)
    page.click("#new-session")
    expect(page.locator("#banner")).to_contain_text("this origin may not open sessions")
    expect(page.locator("#banner")).to_contain_text("allowed_origins")
    expect(page.locator("#conn-state")).to_have_text("offline")
    page.wait_for_timeout(1500)
    assert len(urls) == 1
    sid = page.locator("#session-id").inner_text()
    with keyed.client(keyed.key) as c:
        c.delete(f"/v1/sessions/{sid}")
