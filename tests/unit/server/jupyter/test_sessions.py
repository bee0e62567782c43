"""``/api/sessions`` in the shape JupyterLab's SessionManager (@jupyterlab/services)
reads: create binds a path to a new or existing kernel (201 and the model), a
path already bound answers its session, PATCH renames or changes the kernel
(the one left without session is shut down), DELETE shuts the kernel down;
another key sees none of it; errors in Jupyter's shape."""

from __future__ import annotations

from tests.unit.server.jupyter.conftest import Gateway

MODEL_KEYS = {"id", "path", "name", "type", "kernel", "notebook"}
KERNEL_KEYS = {"id", "name", "last_activity", "execution_state", "connections"}


async def test_session_lifecycle_as_jupyterlab_drives_it(gw: Gateway) -> None:
    async with gw.client(gw.alice) as http, gw.client(gw.bob) as bob:
        body = {"path": "work/a.ipynb", "name": "a.ipynb", "type": "notebook", "kernel": {"name": "python3"}}
        created = await http.post("/api/sessions", json=body)
        assert created.status_code == 201, created.text
        session = created.json()
        assert set(session) == MODEL_KEYS and set(session["kernel"]) == KERNEL_KEYS
        assert (session["path"], session["name"], session["type"]) == ("work/a.ipynb", "a.ipynb", "notebook")
        assert created.headers["location"] == f"/api/sessions/{session['id']}"
        kid = session["kernel"]["id"]
        assert (await http.get(f"/api/kernels/{kid}")).status_code == 200, "the kernel is a kernel of the API"
        async with gw.client(gw.alice, scheme="Bearer") as v1:
            assert (await v1.get(f"/v1/sessions/{kid}")).status_code == 200, "and a kernelgw session"

        again = await http.post("/api/sessions", json=body)
        assert again.status_code == 201 and again.json()["id"] == session["id"], "a bound path answers its session"
        assert [s["id"] for s in (await http.get("/api/sessions")).json()] == [session["id"]]
        assert (await http.get(f"/api/sessions/{session['id']}")).json()["kernel"]["id"] == kid

        # bob sees nothing of alice's
        assert (await bob.get("/api/sessions")).json() == []
        assert (await bob.get(f"/api/sessions/{session['id']}")).status_code == 404
        stolen = await bob.post("/api/sessions", json={"path": "x.ipynb", "kernel": {"id": kid}})
        assert stolen.status_code == 404 and set(stolen.json()) == {"message", "reason"}

        # a console on the same kernel, then the notebook renamed
        console = await http.post("/api/sessions", json={"path": "console-1", "type": "console", "kernel": {"id": kid}})
        assert console.status_code == 201 and console.json()["kernel"]["id"] == kid
        renamed = await http.patch(f"/api/sessions/{session['id']}", json={"path": "work/b.ipynb", "name": "b.ipynb"})
        assert renamed.status_code == 200 and renamed.json()["path"] == "work/b.ipynb"

        # the notebook gets a new kernel: the old one stays (the console still uses it)
        moved = await http.patch(f"/api/sessions/{session['id']}", json={"kernel": {"name": "python3", "id": None}})
        assert moved.status_code == 200
        assert moved.json()["kernel"]["id"] == kid, "the same spec keeps the kernel"
        other = await http.post("/api/kernels", json={})
        moved = await http.patch(f"/api/sessions/{session['id']}", json={"kernel": {"id": other.json()["id"]}})
        assert moved.json()["kernel"]["id"] == other.json()["id"]
        assert (await http.get(f"/api/kernels/{kid}")).status_code == 200

        # deleting the console's session shuts its kernel down (no session left on it)
        assert (await http.delete(f"/api/sessions/{console.json()['id']}")).status_code == 204
        assert (await http.get(f"/api/kernels/{kid}")).status_code == 404
        assert (await http.delete(f"/api/sessions/{session['id']}")).status_code == 204
        assert (await http.get(f"/api/kernels/{other.json()['id']}")).status_code == 404
        assert (await http.get("/api/sessions")).json() == []
        missing = await http.get(f"/api/sessions/{session['id']}")
        assert missing.status_code == 404 and missing.json()["reason"] == "Not Found"


async def test_bad_session_requests_get_jupyter_errors(gw: Gateway) -> None:
    async with gw.client(gw.alice) as http, gw.client() as anonymous:
        no_path = await http.post("/api/sessions", json={"type": "notebook"})
        bad_spec = await http.post("/api/sessions", json={"path": "a.ipynb", "kernel": {"name": "nope"}})
        no_kernel = await http.post("/api/sessions", json={"path": "a.ipynb", "kernel": {"id": "0-0-0-0-0"}})
        not_json = await http.post("/api/sessions", content=b"{", headers={"content-type": "application/json"})
        refused = await anonymous.get("/api/sessions")
    assert no_path.status_code == 400 and "path" in no_path.json()["message"]
    assert bad_spec.status_code == 400 and "nope" in bad_spec.json()["message"]
    assert no_kernel.status_code == 404
    assert not_json.status_code in (400, 422) and set(not_json.json()) == {"message", "reason"}
    assert refused.status_code == 401 and set(refused.json()) == {"message", "reason"}


async def test_deleting_the_kernel_ends_its_sessions(gw: Gateway) -> None:
    async with gw.client(gw.alice) as http:
        session = (await http.post("/api/sessions", json={"path": "c.ipynb"})).json()
        assert session["kernel"]["name"] == "python3" and session["type"] == "notebook"
        assert (await http.delete(f"/api/kernels/{session['kernel']['id']}")).status_code == 204
        assert (await http.get("/api/sessions")).json() == []
        assert (await http.get(f"/api/sessions/{session['id']}")).status_code == 404


async def test_json_bodies_labelled_text_plain_are_read_as_jupyter_server_does(gw: Gateway) -> None:
    """@jupyterlab/services posts JSON strings through fetch, which labels them text/plain."""
    plain = {"content-type": "text/plain;charset=UTF-8"}
    async with gw.client(gw.alice) as http:
        kernel = await http.post("/api/kernels", content=b'{"name": "python3"}', headers=plain)
        session = await http.post("/api/sessions", content=b'{"path": "p.ipynb", "type": "notebook"}', headers=plain)
        bad = await http.post("/api/kernels", content=b'{"name": 3}', headers=plain)
        assert kernel.status_code == 201, kernel.text
        assert session.status_code == 201 and session.json()["path"] == "p.ipynb", session.text
        assert bad.status_code == 400 and "name" in bad.json()["message"]
        await http.delete(f"/api/kernels/{kernel.json()['id']}")
        await http.delete(f"/api/sessions/{session.json()['id']}")
