"""The proof forwarded requests carry: valid only with the same secret, sender,
request line and a recent time; absent is not invalid (a client's request)."""

from __future__ import annotations

import pytest

from kernelgw.cluster import proof
from kernelgw.cluster.errors import ForwardRefused

SECRET = b"s3cret"


def test_a_signed_request_names_its_sender() -> None:
    headers = proof.proof_headers(SECRET, "gw-a", "POST", "/v1/sessions/x/execute", now=1000.0)
    assert proof.verify(SECRET, headers, "POST", "/v1/sessions/x/execute", now=1001.0) == "gw-a"


def test_a_request_without_the_headers_is_a_clients() -> None:
    assert proof.verify(SECRET, {"authorization": "Bearer k"}, "GET", "/v1/sessions", now=0) is None


@pytest.mark.parametrize(
    ("secret", "method", "path", "now", "words"),
    [
        (b"other", "POST", "/v1/sessions/x/execute", 1000.0, "KERNELGW_CLUSTER_SECRET"),
        (SECRET, "DELETE", "/v1/sessions/x/execute", 1000.0, "does not match"),
        (SECRET, "POST", "/v1/sessions/y/execute", 1000.0, "does not match"),
        (SECRET, "POST", "/v1/sessions/x/execute", 1000.0 + proof.MAX_SKEW_S + 1, "clocks"),
        (None, "POST", "/v1/sessions/x/execute", 1000.0, "no cluster_secret"),
    ],
)
def test_a_proof_for_another_secret_request_or_time_is_refused(
    secret: bytes | None, method: str, path: str, now: float, words: str
) -> None:
    headers = proof.proof_headers(SECRET, "gw-a", "POST", "/v1/sessions/x/execute", now=1000.0)
    with pytest.raises(ForwardRefused) as caught:
        proof.verify(secret, headers, method, path, now=now)
    assert words in caught.value.message and "gw-a" in caught.value.message


def test_a_forged_sender_name_breaks_the_proof() -> None:
    headers = proof.proof_headers(SECRET, "gw-a", "GET", "/p", now=5.0) | {proof.FROM_HEADER: "gw-b"}
    with pytest.raises(ForwardRefused):
        proof.verify(SECRET, headers, "GET", "/p", now=5.0)
