"""Settings: env vars, files, and the checks that keep them coherent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from kernelgw.config import Settings


def test_env_vars_override_file_and_explicit_overrides_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "gw.json"
    cfg.write_text(json.dumps({"port": 9000, "max_sessions": 3, "gateway_name": "file"}))
    monkeypatch.setenv("KERNELGW_MAX_SESSIONS", "7")
    settings = Settings.load(cfg, gateway_name="cli")
    assert settings.port == 9000
    assert settings.max_sessions == 7
    assert settings.gateway_name == "cli"


def test_toml_config(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text('runtime = "runsc"\nmemory_mb = 256\n')
    settings = Settings.load(cfg)
    assert settings.runtime == "runsc" and settings.memory_mb == 256


def test_defaults_must_fit_within_maximums() -> None:
    with pytest.raises(ValidationError, match="max_memory_mb"):
        Settings(memory_mb=4096, max_memory_mb=1024)
    with pytest.raises(ValidationError, match="exec_timeout_s"):
        Settings(exec_timeout_s=100, max_exec_timeout_s=10)


def test_runtime_dir_too_long_for_socket_paths() -> None:
    with pytest.raises(ValidationError, match="unix socket"):
        Settings(runtime_dir="/" + "x" * 100)


def test_unknown_setting_is_an_error(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.json"
    cfg.write_text(json.dumps({"max_sesions": 3}))
    with pytest.raises(ValidationError):
        Settings.load(cfg)


def test_env_is_checked_against_the_file_not_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 8192 is above the default max_memory_mb (4096) but within the file's
    cfg = tmp_path / "gw.toml"
    cfg.write_text("max_memory_mb = 16384\n")
    monkeypatch.setenv("KERNELGW_MEMORY_MB", "8192")
    settings = Settings.load(cfg)
    assert settings.memory_mb == 8192 and settings.max_memory_mb == 16384


def test_merged_settings_are_still_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text("max_memory_mb = 16384\n")
    monkeypatch.setenv("KERNELGW_MEMORY_MB", "8192")
    with pytest.raises(ValidationError, match="max_memory_mb"):
        Settings.load(cfg, max_memory_mb=4096)


def test_env_lists_and_objects_are_merged_with_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "gw.json"
    cfg.write_text(json.dumps({"allowed_images": ["file/img"], "pool_size": 2}))
    monkeypatch.setenv("KERNELGW_ALLOWED_IMAGES", '["env/img"]')
    monkeypatch.setenv("KERNELGW_POOL_PROFILES", '[{"memory_mb": 4096, "size": 1}]')
    settings = Settings.load(cfg)
    assert settings.allowed_images == ["env/img"] and settings.pool_size == 2
    assert settings.pool_profiles[0].memory_mb == 4096


def test_kernels_are_known_names_and_each_has_an_image() -> None:
    settings = Settings(kernels=["ruby", "python3", "ruby"], kernel_images={"go": "me/go:1"})
    assert settings.kernels == ["ruby", "python3"] and settings.default_kernel == "ruby"
    assert settings.kernel_image("ruby") == "kernelgw/ruby:latest"
    assert settings.kernel_image("go") == "me/go:1"
    assert settings.kernel_image("python3") == settings.image
    for bad in ({"kernels": ["cobol"]}, {"kernels": []}, {"kernel_images": {"cobol": "x"}}):
        with pytest.raises(ValidationError, match="kernel"):
            Settings(**bad)


def test_kernels_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELGW_KERNELS", '["python3", "deno"]')
    assert Settings.load(None).kernels == ["python3", "deno"]


@pytest.mark.parametrize("name", ["a+b", "with space", "../up", "-lead", "x" * 64, ""])
def test_gateway_names_the_engine_would_refuse_are_refused_at_start(name: str) -> None:
    with pytest.raises(ValidationError, match="gateway_name"):
        Settings(gateway_name=name)


@pytest.mark.parametrize("name", ["default", "gw-1", "host_2.example", "A" * 63])
def test_gateway_names_of_letters_digits_and_separators_are_taken(name: str) -> None:
    assert Settings(gateway_name=name).gateway_name == name


def test_the_gateway_keeps_idle_connections_longer_than_httpx_does() -> None:
    """A client must drop an idle connection before the gateway closes it: with
    both at 5 s, a request sent as the gateway closed the connection failed with
    "Server disconnected without sending a response" (the SDK and E2B's SDK use
    httpx). The header deadline still ends an idle connection soon after."""
    import httpx

    settings = Settings()
    assert settings.keepalive_timeout_s > httpx.Limits().keepalive_expiry + 1
    assert settings.keepalive_timeout_s < settings.header_timeout_s
