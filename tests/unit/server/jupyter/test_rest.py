"""The kernels REST API: shapes jupyter_server's gateway client parses, Kernel
Gateway's status codes, Jupyter's error shape, the three ways to send a key,
and kernels as the sessions they are."""

from __future__ import annotations

import re
from datetime import datetime

import httpx

from tests.unit.server.jupyter.conftest import Gateway

DASHED_UUID = re.compile(r"^\w+-\w+-\w+-\w+-\w+$")  # jupyter_server's kernel id route


async def test_api_version_is_public(gw: Gateway) -> None:
    async with gw.client() as http:
        resp = await http.get("/api")
    assert resp.status_code == 200
    assert "version" in resp.json()


async def test_kernelspecs_have_the_shape_jupyter_server_reads(gw: Gateway) -> None:
    async with gw.client(gw.alice) as http:
        specs = (await http.get("/api/kernelspecs")).json()
        one = await http.get("/api/kernelspecs/python3")
        missing = await http.get("/api/kernelspecs/nope")
    assert specs["default"] == "python3"
    spec = specs["kernelspecs"]["python3"]
    assert spec["name"] == "python3"
    assert set(spec["resources"]) == {"logo-32x32.png", "logo-64x64.png", "logo-svg.svg"}
    assert spec["spec"]["language"] == "python"
    assert "kernelgw" in spec["spec"]["display_name"]
    assert one.status_code == 200 and one.json() == spec
    assert missing.status_code == 404
    assert set(missing.json()) == {"message", "reason"} and missing.json()["reason"] == "Not Found"


async def test_kernelspec_logos_are_served_where_the_spec_points(gw: Gateway) -> None:
    async with gw.client(gw.alice) as http:
        resources = (await http.get("/api/kernelspecs/python3")).json()["resources"]
        png = await http.get(resources["logo-64x64.png"])
        svg = await http.get(resources["logo-svg.svg"])
        unknown = await http.get("/kernelspecs/python3/../../etc/passwd")
        other_spec = await http.get("/kernelspecs/nope/logo-64x64.png")
    async with gw.client() as anonymous:
        refused = await anonymous.get(resources["logo-64x64.png"])
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png.content.startswith(b"\x89PNG")
    assert svg.status_code == 200 and b"<svg" in svg.content
    assert unknown.status_code == 404 and other_spec.status_code == 404
    assert refused.status_code == 401


async def test_kernel_lifecycle_with_kernel_gateway_status_codes(gw: Gateway) -> None:
    async with gw.client(gw.alice) as http:
        started = await http.post("/api/kernels", json={"name": "python3", "env": {"KERNEL_USERNAME": "alice"}})
        assert started.status_code == 201, started.text
        model = started.json()
        assert set(model) == {"id", "name", "last_activity", "execution_state", "connections"}
        assert DASHED_UUID.match(model["id"])
        assert model["name"] == "python3"
        assert isinstance(model["connections"], int) and model["connections"] == 0
        # jupyter_server parses exactly this format (anything else is a 500 in its kernel list)
        datetime.strptime(model["last_activity"], "%Y-%m-%dT%H:%M:%S.%fZ")
        kid = model["id"]

        listed = (await http.get("/api/kernels")).json()
        assert [k["id"] for k in listed] == [kid]
        assert (await http.get(f"/api/kernels/{kid}")).json()["id"] == kid

        interrupted = await http.post(f"/api/kernels/{kid}/interrupt", json={})
        assert interrupted.status_code == 204
        # AutoGen restarts with an empty octet-stream body
        restarted = await http.post(
            f"/api/kernels/{kid}/restart", content=b"", headers={"Content-Type": "application/octet-stream"}
        )
        assert restarted.status_code == 200, restarted.text
        assert restarted.json()["id"] == kid

        # the same session on the /v1 face
        v1 = await http.get(f"/v1/sessions/{kid}", headers={"Authorization": f"Bearer {gw.alice}"})
        assert v1.status_code == 200 and v1.json()["id"] == kid

        assert (await http.delete(f"/api/kernels/{kid}")).status_code == 204
        gone = await http.get(f"/api/kernels/{kid}")
        assert gone.status_code == 404 and set(gone.json()) == {"message", "reason"}
        assert (await http.delete(f"/api/kernels/{kid}")).status_code == 404


async def test_start_with_no_body_as_open_webui_does_with_token_in_the_query(gw: Gateway) -> None:
    async with gw.client() as http:
        resp = await http.post(f"/api/kernels?token={gw.alice}")
        assert resp.status_code == 201, resp.text
        kid = resp.json()["id"]
        assert (await http.delete(f"/api/kernels/{kid}?token={gw.alice}")).status_code == 204


async def test_bad_bodies_get_a_clear_400(gw: Gateway) -> None:
    async with gw.client(gw.alice) as http:
        unknown = await http.post("/api/kernels", json={"name": "python3", "kernel_cmd": ["sh"]})
        env = await http.post("/api/kernels", json={"env": {"LD_PRELOAD": "/x.so"}})
        spec = await http.post("/api/kernels", json={"name": "ruby"})
        not_json = await http.post("/api/kernels", content=b"{", headers={"Content-Type": "application/json"})
        assert (await http.get("/api/kernels")).json() == []
    for resp in (unknown, env, spec, not_json):
        assert resp.status_code == 400, resp.text
        assert set(resp.json()) == {"message", "reason"} and resp.json()["reason"] == "Bad Request"
    assert "kernel_cmd" in unknown.json()["message"]
    assert "KERNEL_" in env.json()["message"]
    assert "ruby" in spec.json()["message"]


async def test_keys_token_bearer_query_all_work_and_others_get_401_in_jupyter_shape(gw: Gateway, kernel: str) -> None:
    for headers, params in (
        ({"Authorization": f"token {gw.alice}"}, {}),
        ({"Authorization": f"Bearer {gw.alice}"}, {}),
        ({}, {"token": gw.alice}),
    ):
        async with httpx.AsyncClient(base_url=gw.url, headers=headers, params=params) as http:
            assert (await http.get(f"/api/kernels/{kernel}")).status_code == 200
    for headers, params in (
        ({}, {}),
        ({"Authorization": "token kgw_000000000000_" + "A" * 43}, {}),
        ({"Authorization": f"Basic {gw.alice}"}, {}),
        ({}, {"token": "not-a-token"}),
    ):
        async with httpx.AsyncClient(base_url=gw.url, headers=headers, params=params) as http:
            for path in ("/api/kernels", "/api/kernelspecs", f"/api/kernels/{kernel}"):
                resp = await http.get(path)
                assert resp.status_code == 401, (headers, params, path)
                assert resp.json()["reason"] == "Unauthorized" and resp.json()["message"]


async def test_another_keys_kernel_is_not_found(gw: Gateway, kernel: str) -> None:
    async with gw.client(gw.bob) as http:
        assert (await http.get("/api/kernels")).json() == []
        for method, path in (
            ("GET", f"/api/kernels/{kernel}"),
            ("DELETE", f"/api/kernels/{kernel}"),
            ("POST", f"/api/kernels/{kernel}/interrupt"),
            ("POST", f"/api/kernels/{kernel}/restart"),
        ):
            resp = await http.request(method, path)
            assert resp.status_code == 404, (method, path)
    async with gw.client(gw.alice) as http:
        assert (await http.get(f"/api/kernels/{kernel}")).status_code == 200


async def test_a_v1_session_is_a_jupyter_kernel(gw: Gateway) -> None:
    async with gw.client(gw.alice, scheme="Bearer") as http:
        sid = (await http.post("/v1/sessions", json={})).json()["id"]
        try:
            model = (await http.get(f"/api/kernels/{sid}")).json()
            assert model["name"] == "python3"
            assert model["id"].replace("-", "") == sid.replace("-", "")
            assert DASHED_UUID.match(model["id"])
            assert [k["id"] for k in (await http.get("/api/kernels")).json()] == [model["id"]]
        finally:
            await http.delete(f"/v1/sessions/{sid}")
