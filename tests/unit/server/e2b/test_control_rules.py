"""The control plane's pure rules: list queries and pages, what a create may ask
for, templates, access tokens, and errors in E2B's shape read back by E2B's SDK."""

from __future__ import annotations

import json
import urllib.parse
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
from e2b.api import handle_api_exception
from e2b.exceptions import AuthenticationException, RateLimitException, SandboxException, ServiceBusyException
from starlette.datastructures import Headers
from starlette.requests import Request

from kernelgw.config import Settings
from kernelgw.errors import (
    GatewayDraining,
    LimitExceeded,
    RateLimited,
    SessionLimitReached,
    SessionNotFound,
    Unauthorized,
)
from kernelgw.kernels import CODE_INTERPRETER_BUNDLE, bundle_image
from kernelgw.runtime.lease import SessionTerms
from kernelgw.runtime.session import KernelSession
from kernelgw.server.e2b import auth, control, listing, templates, unserved
from kernelgw.server.e2b.errors import E2BError, to_response
from kernelgw.server.e2b.models import ListedSandbox, NetworkConfig, NewSandbox, unknown_fields

T0 = datetime(2026, 1, 1, tzinfo=UTC)


# ---------------------------------------------------------------- list queries
def sdk_metadata_query(metadata: dict[str, str]) -> str:
    """The ``metadata`` query value as E2B's SDK builds it (``SandboxPaginator.next_items``):
    each key and value quoted, then the pairs url-encoded (what the route receives)."""
    quoted = {urllib.parse.quote(k): urllib.parse.quote(v) for k, v in metadata.items()}
    return urllib.parse.urlencode(quoted)


@pytest.mark.parametrize(
    "metadata",
    [{"user": "alice"}, {"a b": "x&y=z", "ünï": "100%"}, {"k": ""}, {"app": "prod", "team": "a/b?c#d"}],
)
def test_metadata_filter_reads_what_the_sdk_sends(metadata: dict[str, str]) -> None:
    assert listing.parse_metadata_query(sdk_metadata_query(metadata)) == metadata


def test_a_metadata_filter_that_is_no_query_is_a_400() -> None:
    with pytest.raises(E2BError) as refused:
        listing.parse_metadata_query("no-equals-sign")
    assert refused.value.status == 400 and "key=value" in refused.value.message


def test_states_default_to_both_and_unknown_ones_are_named() -> None:
    assert listing.parse_states(None) == {"running", "paused"}
    assert listing.parse_states("paused") == {"paused"}
    assert listing.parse_states("running,paused") == {"running", "paused"}
    with pytest.raises(E2BError) as refused:
        listing.parse_states("running,sleeping")
    assert refused.value.status == 400 and "sleeping" in refused.value.message


def sandbox(n: int, started: datetime) -> ListedSandbox:
    return ListedSandbox(
        template_id="base",
        sandbox_id=f"s{n:02d}",
        started_at=started,
        end_at=started,
        cpu_count=1,
        memory_mb=512,
        disk_size_mb=512,
        state="running",
    )


@pytest.mark.parametrize("order", ["asc", "desc"])
@pytest.mark.parametrize("limit", [1, 2, 3, 7, 100])
def test_pages_walk_every_sandbox_once_in_order(order: str, limit: int) -> None:
    # two pairs start at the same instant: the id orders them
    starts = [
        T0,
        T0 + timedelta(seconds=1),
        T0 + timedelta(seconds=1),
        T0 + timedelta(seconds=2),
        T0,
        T0 + timedelta(seconds=5),
    ]
    items = [sandbox(n, s) for n, s in enumerate(starts)]
    seen: list[ListedSandbox] = []
    cursor = None
    for _ in range(len(items) + 1):
        page, token = listing.paginate(items, order, cursor, limit)  # type: ignore[arg-type]
        assert len(page) <= limit
        seen += page
        if token is None:
            break
        cursor = listing.Cursor.decode(token)
    keys = [(s.started_at, s.sandbox_id) for s in seen]
    assert sorted(keys, reverse=order == "desc") == keys
    assert sorted(s.sandbox_id for s in seen) == sorted(s.sandbox_id for s in items)


def test_a_page_past_the_end_is_empty_and_the_last_page_has_no_token() -> None:
    items = [sandbox(n, T0 + timedelta(seconds=n)) for n in range(3)]
    page, token = listing.paginate(items, "desc", None, 3)
    assert len(page) == 3 and token is None
    after_all = listing.Cursor(T0 - timedelta(seconds=1), "")
    assert listing.paginate(items, "desc", after_all, 3) == ([], None)


def test_a_token_no_page_gave_is_a_400() -> None:
    for token in ("!!!", "bm90IGpzb24", listing.Cursor(T0, "x").encode()[:-3]):
        with pytest.raises(E2BError) as refused:
            listing.Cursor.decode(token)
        assert refused.value.status == 400


# ---------------------------------------------------------------- what a create may ask for
def new(**fields: Any) -> NewSandbox:
    return NewSandbox.model_validate({"templateID": "base", **fields})


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"allow_internet_access": True}, "allow_internet_access"),
        ({"network": {"allowOut": ["1.1.1.1"]}}, "allowOut"),
        ({"network": {"allowPublicTraffic": True}}, "allowPublicTraffic"),
        ({"network": {"egressProxy": {"address": "proxy:1080"}}}, "egressProxy"),
        ({"network": {"maskRequestHost": "${PORT}-x.example.com"}}, "maskRequestHost"),
        ({"network": {"httpsPorts": [3000]}}, "httpsPorts"),
        ({"network": {"rules": {"api.example.com": []}}}, "rules"),
        ({"network": {"dnsServers": ["1.1.1.1"]}}, "dnsServers"),
        ({"network": {"somethingNew": 1}}, "somethingNew"),
        ({"mcp": {"github/x/y": {}}}, "mcp"),
        ({"volumeMounts": [{"name": "v", "path": "/data"}]}, "volumeMounts"),
        ({"iam": {"tokens": {"aws": {}}}}, "iam"),
        ({"autoResume": {"enabled": False}}, "autoResume"),
        ({"autoPause": True, "autoPauseMemory": False}, "autoPauseMemory"),
        ({"futureField": True}, "futureField"),
        ({"timeout": 0}, "Timeout must be greater than 0"),
    ],
)
def test_a_create_asking_for_what_a_sandbox_here_cannot_give_is_a_400_naming_it(
    fields: dict[str, Any], named: str
) -> None:
    with pytest.raises(E2BError) as refused:
        control.refuse_unsupported(new(**fields))
    assert refused.value.status == 400
    assert named in refused.value.message


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"allow_internet_access": False, "secure": False},
        {"network": {"denyOut": ["0.0.0.0/0"], "allowPublicTraffic": False, "allowOut": [], "dnsServers": []}},
        {"autoPause": True, "autoResume": {"enabled": True}},
        {"metadata": {"user": "alice"}, "envVars": {"A": "1"}, "mcp": None},
    ],
)
def test_what_keeps_a_sandbox_closed_passes(fields: dict[str, Any]) -> None:
    control.refuse_unsupported(new(**fields))


def test_a_request_keeps_unknown_fields_so_they_can_be_named() -> None:
    assert unknown_fields(NetworkConfig.model_validate({"denyOut": [], "newThing": 1})) == ["newThing"]
    assert unknown_fields(new()) == []


def test_metadata_keys_of_the_face_are_refused() -> None:
    with pytest.raises(ValueError, match="kernelgw's own"):
        new(metadata={templates.TEMPLATE_KEY: "x"})
    with pytest.raises(ValueError, match="string"):
        new(metadata={"n": 1})


# ---------------------------------------------------------------- templates
def session_running(kernel: str, image: str, metadata: dict[str, str] | None = None) -> KernelSession:
    """Only what `templates.template_of` reads of a session."""
    return cast(
        KernelSession, SimpleNamespace(spec=SimpleNamespace(kernel=kernel, image=image), metadata=metadata or {})
    )


def test_templates_name_kernels_and_images() -> None:
    settings = Settings(image="py:1", e2b_templates={"deno-v1": "deno", "science": "py:science"})
    assert templates.resolve(settings, "code-interpreter-v1") == templates.Template(
        "code-interpreter-v1", "python3", None
    )
    assert templates.resolve(settings, "base").kernel == "python3"
    assert templates.resolve(settings, "deno-v1") == templates.Template("deno-v1", "deno", None)
    assert templates.resolve(settings, "science") == templates.Template("science", "python3", "py:science")
    with pytest.raises(E2BError) as missing:
        templates.resolve(settings, "nodejs-v2")
    assert missing.value.status == 404
    assert "nodejs-v2" in missing.value.message and "science" in missing.value.message


def test_a_sandbox_answers_with_its_template_else_what_runs_it() -> None:
    settings = Settings(image="py:1", e2b_templates={"science": "py:science"})
    kept = session_running("python3", "py:1", {templates.TEMPLATE_KEY: "base"})
    assert templates.template_of(kept, settings) == "base"
    assert templates.template_of(session_running("python3", "py:1"), settings) == "code-interpreter-v1"
    assert templates.template_of(session_running("python3", "py:science"), settings) == "science"
    assert templates.template_of(session_running("python3", "other:2"), settings) == "other:2"


class Engine:
    """What `templates.has_bundle` asks of a backend: which images it has."""

    def __init__(self, *images: str) -> None:
        self.images = set(images)
        self.asked = 0

    async def image_labels(self, image: str) -> dict[str, str] | None:
        self.asked += 1
        return {} if image in self.images else None


async def test_code_interpreter_v1_runs_the_code_interpreter_image_where_the_engine_has_it() -> None:
    bundle = bundle_image(CODE_INTERPRETER_BUNDLE)
    settings = Settings(image="py:1", e2b_templates={"science": "py:science"})
    default = templates.resolve(settings, "code-interpreter-v1")
    with_it, without = Engine(bundle), Engine()
    assert (await templates.for_create(settings, cast(Any, with_it), default)).image == bundle
    assert (await templates.for_create(settings, cast(Any, without), default)).image is None  # the Python one
    await templates.for_create(settings, cast(Any, with_it), default)
    assert with_it.asked == 1  # the engine's answer is kept a while
    # other templates, and a code-interpreter-v1 the setting maps, run what they name
    base, science = templates.resolve(settings, "base"), templates.resolve(settings, "science")
    assert await templates.for_create(settings, cast(Any, with_it), base) == base
    assert await templates.for_create(settings, cast(Any, with_it), science) == science
    pinned = Settings(image="py:1", e2b_templates={"code-interpreter-v1": "python3"})
    mapped = templates.resolve(pinned, "code-interpreter-v1")
    assert await templates.for_create(pinned, cast(Any, with_it), mapped) == mapped


def test_the_template_setting_needs_both_sides() -> None:
    with pytest.raises(ValueError, match="needs a template id"):
        Settings(e2b_templates={"x": " "})


# ---------------------------------------------------------------- access tokens
def test_the_access_token_derives_from_the_key_and_is_kept_as_its_hash_only() -> None:
    alice = auth.Caller(cast(Any, None), "kgw_alice")
    access = auth.new_access(alice)
    terms = SessionTerms(metadata={auth.ACCESS_NONCE_KEY: access.nonce}, access_sha256=access.sha256)
    session = cast(KernelSession, SimpleNamespace(metadata=terms.metadata, check_access=terms.check_access))
    assert access.token not in (access.nonce, access.sha256)
    assert auth.access_token(alice, session) == access.token  # connect gives the same token again
    assert auth.access_token(auth.Caller(cast(Any, None), "kgw_bob"), session) is None
    assert auth.new_access(alice).token != access.token  # a nonce per sandbox


def test_the_key_comes_from_x_api_key_or_bearer() -> None:
    assert auth.key_text(Headers({"X-API-KEY": " k1 "})) == "k1"
    assert auth.key_text(Headers({"x-api-key": "k1", "Authorization": "Bearer k2"})) == "k1"
    assert auth.key_text(Headers({"Authorization": "Bearer k2"})) == "k2"
    assert auth.key_text(Headers({"Authorization": "Basic k2"})) is None
    assert auth.key_text(Headers({})) is None


# ---------------------------------------------------------------- errors, as E2B's SDK reads them
def answer(exc: Exception) -> httpx.Response:
    request = Request({"type": "http", "method": "GET", "path": "/e2b/x", "headers": [], "client": ("127.0.0.1", 1)})
    response = to_response(request, exc)
    assert response is not None
    return httpx.Response(response.status_code, headers=dict(response.headers), content=bytes(response.body))


def test_errors_keep_their_status_and_come_out_as_the_sdk_expects() -> None:
    unauthorized = answer(Unauthorized())
    assert unauthorized.status_code == 401 and "E2B_API_KEY" in unauthorized.json()["message"]
    assert isinstance(handle_api_exception(unauthorized), AuthenticationException)

    limit = answer(SessionLimitReached("This API key already holds its maximum of 2 sessions."))
    assert limit.headers["Should-Retry"] == "false"  # the SDK does not retry what a retry cannot change
    assert isinstance(handle_api_exception(limit), RateLimitException)

    rate = answer(RateLimited("slow down", 3))
    assert rate.headers["Retry-After"] == "3" and "Should-Retry" not in rate.headers

    draining = answer(GatewayDraining("draining"))
    assert isinstance(handle_api_exception(draining), ServiceBusyException)

    invalid = handle_api_exception(answer(LimitExceeded("at most 4096 MB")))
    assert isinstance(invalid, SandboxException) and invalid.status_code == 400 and "4096" in str(invalid)

    missing = answer(SessionNotFound("abc"))
    assert missing.status_code == 404
    assert json.loads(missing.content) == {
        "code": 404,
        "message": "Sandbox abc not found",
        "error_code": "sandbox_not_found",
    }


def test_unserved_routes_are_named() -> None:
    assert unserved.unserved("/sandboxes/x/logs") is not None
    assert unserved.unserved("/v2/sandboxes/x/logs") is not None
    assert unserved.unserved("/v3/templates") is not None
    assert unserved.unserved("/volumes/v1") is not None
    assert unserved.unserved("/sandboxes/x") is None
    # envd's files and commands are served (their own routers), not named here
    for served in ("/filesystem.Filesystem/ListDir", "/files", "/process.Process/Start", "/process.Process/"):
        assert unserved.unserved(served) is None, served
    assert unserved.unserved("/nothing") is None
