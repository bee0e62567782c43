"""The one rule for a session's ``env`` (kernelgw.models.check_env), at both
faces' models, and how the gateway's helpers are run (helper_command)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kernelgw.models import MAX_ENV_BYTES, MAX_ENV_NAME, MAX_ENV_VALUE, MAX_ENV_VARS, CreateSession, check_env
from kernelgw.runtime.backends.base import HELPER_ENV, HelperPathNotAbsolute, helper_command
from kernelgw.server.jupyter.models import StartKernel


def refused(env: dict[str, str]) -> str:
    with pytest.raises(ValueError) as caught:
        check_env(env)
    return str(caught.value)


def test_ordinary_variables_pass_unchanged() -> None:
    env = {"MY_TOKEN": "a=b c\nd", "_x1": "", "PYTHONPATH": "/workspace/lib", "KERNEL_USERNAME": "ann"}
    assert check_env(env) == env


@pytest.mark.parametrize(
    "name",
    ["PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_ANYTHING", "GCONV_PATH", "GLIBC_TUNABLES", "BASH_ENV"],
)
def test_loader_and_lookup_variables_are_refused_by_name(name: str) -> None:
    message = refused({"OK": "1", name: "/tmp/x"})
    assert f"environment variable {name} cannot be set" in message
    assert "os.environ" in message


@pytest.mark.parametrize("name", ["1X", "A-B", "A B", "", "A\x00B", "FOO\n", "BASH_FUNC_f%%", "É"])
def test_names_must_be_shell_identifiers(name: str) -> None:
    assert "is not a valid environment variable name" in refused({name: "v"})


def test_a_nul_in_a_value_names_the_variable() -> None:
    assert refused({"GOOD": "x", "BAD": "a\x00b"}) == (
        "environment variable BAD holds a NUL character, which no environment can carry"
    )


def test_sizes_are_bounded_and_named() -> None:
    assert "environment variable BIG is" in refused({"BIG": "x" * (MAX_ENV_VALUE + 1)})
    assert "longer than" in refused({"N" * (MAX_ENV_NAME + 1): "v"})
    assert f"at most {MAX_ENV_VARS}" in refused({f"V{i}": "" for i in range(MAX_ENV_VARS + 1)})
    many = {f"V{i}": "x" * (MAX_ENV_VALUE - 10) for i in range(MAX_ENV_BYTES // MAX_ENV_VALUE + 1)}
    assert f"the limit is {MAX_ENV_BYTES}" in refused(many)
    assert check_env({"N" * MAX_ENV_NAME: "x" * MAX_ENV_VALUE}) is not None


def test_both_faces_use_the_rule() -> None:
    with pytest.raises(ValidationError, match="environment variable LD_PRELOAD cannot be set"):
        CreateSession.model_validate({"env": {"LD_PRELOAD": "/tmp/x.so"}})
    with pytest.raises(ValidationError, match="environment variable KERNEL_X holds a NUL"):
        StartKernel.model_validate({"env": {"KERNEL_X": "a\x00"}})
    with pytest.raises(ValidationError, match="KERNEL_"):
        StartKernel.model_validate({"env": {"PATH": "/tmp/bin"}})


def test_helpers_run_under_env_i_with_a_fixed_environment() -> None:
    argv = helper_command(["/usr/bin/tar", "-cf", "-", "."])
    assert argv[:2] == ["/usr/bin/env", "-i"]
    assert argv[2 : 2 + len(HELPER_ENV)] == list(HELPER_ENV)
    assert argv[2 + len(HELPER_ENV) :] == ["/usr/bin/tar", "-cf", "-", "."]
    assert "PATH=/usr/bin:/bin" in HELPER_ENV
    assert all("=" in assignment for assignment in HELPER_ENV)


@pytest.mark.parametrize("argv", [["tar", "-cf", "-"], ["python3"], ["./tar"], []])
def test_a_helper_named_without_an_absolute_path_is_refused(argv: list[str]) -> None:
    with pytest.raises(HelperPathNotAbsolute):
        helper_command(argv)
