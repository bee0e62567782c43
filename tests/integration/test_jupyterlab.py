"""JupyterLab, in headless Chromium (Debian's, driven by Playwright), in front of
kernelgw on Docker kernels: ``jupyter lab --gateway-url=<kernelgw>`` with a key
required. A notebook made from the launcher's kernelgw card runs ``print(6*7)``
(typed, Shift+Enter), a pandas DataFrame (its HTML table) and a matplotlib plot
(an ``<img>`` in the output area); the notebook's kernel is the kernelgw session
of the same id on ``/v1/sessions`` ("one session, two faces"); shutting it down
from JupyterLab's server removes it from kernelgw.

A screenshot of the notebook goes to ``<output_dir>/jupyterlab/notebook.png``
(docs/jupyterlab.png is one of these).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest
from playwright.sync_api import Locator, Page, expect, sync_playwright

from tests.integration.conftest import RunningGateway, gateway_with_key
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.jupyter_lab import jupyter_lab

pytestmark = pytest.mark.integration

# the first cell waits for a container to start behind JupyterLab's kernel start
WAIT_MS = 120_000


@pytest.fixture(scope="module")
def keyed_gateway(
    docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningGateway, str]]:
    with gateway_with_key(docker_client, tmp_path_factory.mktemp("jupyterlab-gw"), f"tjl{os.getpid()}") as pair:
        yield pair


def _run_cell(page: Page, index: int, code: str) -> Locator:
    """Type code into the notebook's cell ``index`` and press Shift+Enter; the cell."""
    cell = page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").nth(index)
    expect(cell).to_be_visible(timeout=WAIT_MS)
    editor = cell.locator(".cm-content")
    editor.click()
    page.keyboard.type(code)
    expect(editor).to_have_text(code)
    page.keyboard.press("Shift+Enter")
    return cell


def test_jupyterlab_notebook_runs_on_kernelgw(
    keyed_gateway: tuple[RunningGateway, str], tmp_path: Path, output_dir: Path
) -> None:
    gw, key = keyed_gateway
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"No Chromium at {CHROMIUM}; run scripts/ensure-chromium.sh", pytrace=False)
    os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"
    shots = output_dir / "jupyterlab"
    shots.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []

    with (
        httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as kgw,
        jupyter_lab(gw.url, key, tmp_path / "lab") as lab,
        lab.http() as lab_http,
        sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{lab.url}/lab?token={lab.token}")

            # the launcher offers kernelgw's kernelspec; its notebook card makes a notebook with it
            card = page.locator('.jp-LauncherCard[data-category="Notebook"]', has_text="kernelgw")
            expect(card).to_be_visible(timeout=WAIT_MS)
            card.click()
            expect(page.locator(".jp-NotebookPanel .jp-Notebook")).to_be_visible(timeout=WAIT_MS)
            # connected: a cell run before the channels WebSocket is up is lost (JupyterLab's first
            # handshake, with the v1 subprotocol, fails against jupyter_server's gateway mode; it retries)
            expect(page.get_by_text("Python 3 (kernelgw sandbox) | Idle")).to_be_visible(timeout=WAIT_MS)

            first = _run_cell(page, 0, "print(6*7)")
            expect(first.locator(".jp-OutputArea-output")).to_have_text("42", timeout=WAIT_MS)

            table = _run_cell(page, 1, "import pandas as pd; pd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
            expect(table.locator(".jp-OutputArea-output table.dataframe")).to_be_visible(timeout=WAIT_MS)

            plot = _run_cell(page, 2, "import matplotlib.pyplot as plt; plt.plot([1, 3, 2, 4]); plt.show()")
            image = plot.locator(".jp-OutputArea-output img")
            expect(image).to_be_visible(timeout=WAIT_MS)
            assert (image.get_attribute("src") or "").startswith("data:image/png;base64,")

            # one session, two faces: JupyterLab's kernel is kernelgw's kernel and /v1 session
            lab_kernels = lab_http.get("/api/kernels").json()
            kgw_kernels = kgw.get("/api/kernels").json()
            assert [k["id"] for k in lab_kernels] == [k["id"] for k in kgw_kernels], (lab_kernels, kgw_kernels)
            (kernel_id,) = [k["id"] for k in kgw_kernels]
            sessions = kgw.get("/v1/sessions").json()["sessions"]
            assert kernel_id in [s["id"] for s in sessions], sessions

            page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").first.click()
            page.screenshot(path=str(shots / "notebook.png"))

            # shut down from JupyterLab's server: gone from kernelgw too
            assert lab_http.delete(f"/api/kernels/{kernel_id}").status_code == 204
            assert kgw.get(f"/api/kernels/{kernel_id}").status_code == 404
        finally:
            browser.close()
    assert not errors, f"uncaught errors in JupyterLab: {errors}"
