"""Whose X-Forwarded-For is believed (`kernelgw.server.proxies`): pure matching."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kernelgw.config import Settings
from kernelgw.server.proxies import TrustedProxies


def test_nobody_is_trusted_by_default_not_even_loopback() -> None:
    none = TrustedProxies(Settings().trusted_proxies)
    assert not none
    assert not none.trusts("127.0.0.1") and not none.trusts("::1")
    assert none.client("127.0.0.1", ["203.0.113.9"]) == "127.0.0.1"


def test_addresses_and_networks_match_v4_v6_and_mapped() -> None:
    trusted = TrustedProxies(["10.0.0.0/8", "192.0.2.7", "2001:db8::/32"])
    assert trusted.trusts("10.1.2.3") and trusted.trusts("192.0.2.7")
    assert not trusted.trusts("192.0.2.8") and not trusted.trusts("11.0.0.1")
    assert trusted.trusts("2001:db8::1") and trusted.trusts("[2001:db8::1]")
    assert trusted.trusts("::ffff:10.9.9.9")  # an IPv4 peer on a dual-stack socket
    assert not trusted.trusts("not-an-address") and not trusted.trusts("")


def test_client_is_the_rightmost_untrusted_hop() -> None:
    trusted = TrustedProxies(["10.0.0.0/8"])
    # the client may write anything on the left: only what trusted proxies appended counts
    assert trusted.client("10.0.0.2", ["6.6.6.6, 198.51.100.4, 10.0.0.3"]) == "198.51.100.4"
    assert trusted.client("10.0.0.2", ["6.6.6.6", "198.51.100.4"]) == "198.51.100.4"  # repeated headers
    assert trusted.client("10.0.0.2", ["10.0.0.4, 10.0.0.3"]) == "10.0.0.4"  # all proxies: the leftmost
    assert trusted.client("10.0.0.2", []) == "10.0.0.2"
    assert trusted.client("198.51.100.4", ["6.6.6.6"]) == "198.51.100.4"  # an untrusted peer's header: ignored


def test_a_bad_entry_is_refused_at_start_naming_it() -> None:
    with pytest.raises(ValidationError, match=r"'10\.0\.0\.300'"):
        Settings(trusted_proxies=["10.0.0.300"])
    assert Settings(trusted_proxies=[" 10.0.0.0/8 "]).trusted_proxies == ["10.0.0.0/8"]
