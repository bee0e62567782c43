"""E2B's default template on the code-interpreter image (every language of E2B's
code interpreter in one image, `kernelgw.kernels.BUNDLES`), its SDK from PyPI
unchanged: one sandbox runs python, javascript, typescript, r, java and bash
side by side, each language a context (a kernel of its own) sharing the
sandbox's files, every one with E2B's home, ``/home/user``. scripts/test.sh's
languages pass builds the image first (``kernelgw image build --kernel
code-interpreter``); without it these tests fail, as the image is what they test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from e2b_code_interpreter import Sandbox

from kernelgw.kernels import CODE_INTERPRETER_BUNDLE, bundle_image
from tests.integration.conftest import gateway_with_key
from tests.integration.e2b.conftest import E2BGateway

pytestmark = pytest.mark.integration
IMAGE = bundle_image(CODE_INTERPRETER_BUNDLE)

# each language: code that reads the file the python context wrote, and prints
# it with the language's idea of its home and working directory
READS = {
    "javascript": 'console.log(Deno.readTextFileSync("/home/user/note.txt"), Deno.env.get("HOME"), Deno.cwd())',
    "typescript": 'const t: string = Deno.readTextFileSync("/home/user/note.txt"); console.log(t, Deno.env.get("HOME"))',
    "r": 'cat(readLines("/home/user/note.txt"), Sys.getenv("HOME"), getwd(), "\\n")',
    "java": 'System.out.println(java.nio.file.Files.readString(java.nio.file.Path.of("/home/user/note.txt")) '
    '+ " " + System.getenv("HOME") + " " + System.getProperty("user.dir"));',
    "bash": 'echo "$(cat /home/user/note.txt) $HOME $(pwd)"',
}


@pytest.fixture(scope="module")
def e2b_gateway(docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BGateway]:
    """A gateway whose ``code-interpreter-v1`` is E2B's default: unmapped (the
    test gateways pin it to the Python image otherwise)."""
    assert docker_client.images.list(name=IMAGE), (
        f"{IMAGE} is not built (kernelgw image build --kernel code-interpreter)"
    )
    data_dir: Path = tmp_path_factory.mktemp("ci-data")
    # the gateway's default memory (2048 MB), not the tests' 512: six kernels take about 500 MB
    with gateway_with_key(docker_client, data_dir, f"ci{os.getpid()}", e2b_templates={}, memory_mb=2048) as (gw, key):
        yield E2BGateway(gw, key)


@pytest.fixture
def sbx(e2b_gateway: E2BGateway, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    e2b_gateway.use(monkeypatch)
    sandbox = Sandbox.create(timeout=300)
    try:
        yield sandbox
    finally:
        sandbox.kill()


def test_every_language_runs_in_one_sandbox_sharing_its_files_and_home(sbx: Sandbox) -> None:
    assert sbx.get_info().template_id == "code-interpreter-v1"
    first = sbx.run_code(
        "import os\nopen('/home/user/note.txt', 'w').write('shared')\nprint(os.path.expanduser('~'), os.environ['HOME'])"
    )
    assert first.error is None and first.logs.stdout == ["/home/user /home/user\n"], first
    for language, code in READS.items():
        execution = sbx.run_code(code, language=language)
        assert execution.error is None, (language, execution.error)
        out = "".join(execution.logs.stdout).split()
        assert out[:2] == ["shared", "/home/user"], (language, execution.logs)
        if len(out) > 2:  # the working directory, where the language names it: the workspace /home/user is
            assert out[2] in ("/home/user", "/workspace"), (language, out)
    # state stays in each language's context
    assert sbx.run_code("let kept = 41", language="javascript").error is None
    assert sbx.run_code("kept + 1", language="javascript").text == "42"
    assert sbx.run_code("kept <- 6 * 7", language="r").error is None
    assert "42" in "".join(sbx.run_code("cat(kept)", language="r").logs.stdout)
    languages = sorted(c.language for c in sbx.list_code_contexts())
    assert languages == sorted(["python", *READS]), languages


def test_commands_have_e2b_home(sbx: Sandbox) -> None:
    assert sbx.commands.run("echo $HOME; cd ~ && pwd").stdout == "/home/user\n/home/user\n"
