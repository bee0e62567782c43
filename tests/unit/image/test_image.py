"""Pure logic of kernelgw.image's modules (no Docker needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelgw import image
from kernelgw.errors import KernelGWError
from kernelgw.image import apt_mirror, context, docker_build

DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""

DEB822_SECURITY_FIRST_AND_MIRROR = """\
Types: deb deb-src
URIs: http://security.debian.org/debian-security
Suites: bookworm-security
Components: main

Types: deb-src
URIs: http://source-only.example/debian
Suites: bookworm

Enabled: no
Types: deb
URIs: http://disabled.example/debian
Suites: bookworm

Types: deb
URIs: http://mirror.example.org/debian/
Suites: bookworm
 bookworm-updates
Components: main contrib
"""

DEB822_NODESOURCE = """\
Types: deb
URIs: https://deb.nodesource.com/node_20.x
Suites: nodistro
Components: main
"""

SOURCES_LIST = """\
# deb cdrom:[Debian GNU/Linux 12.0.0 _Bookworm_]/ bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/debian.gpg] http://ftp.de.debian.org/debian/ bookworm main contrib
deb-src http://ftp.de.debian.org/debian/ bookworm main
deb http://security.debian.org/debian-security bookworm-security main
deb http://ftp.de.debian.org/debian/ bookworm-updates main
"""


def test_deb822_mirror() -> None:
    assert apt_mirror.parse_deb822_mirror(DEB822) == "http://deb.debian.org/debian"


def test_deb822_skips_security_source_disabled_and_trailing_slash() -> None:
    assert apt_mirror.parse_deb822_mirror(DEB822_SECURITY_FIRST_AND_MIRROR) == "http://mirror.example.org/debian"


def test_deb822_unrelated_repository_gives_none() -> None:
    assert apt_mirror.parse_deb822_mirror(DEB822_NODESOURCE) is None
    assert apt_mirror.parse_deb822_mirror("") is None


def test_sources_list_mirror() -> None:
    assert apt_mirror.parse_sources_list_mirror(SOURCES_LIST) == "http://ftp.de.debian.org/debian"


def test_sources_list_other_suite_falls_back_to_debian_path() -> None:
    text = "deb http://archive.example/debian trixie main\n"
    assert apt_mirror.parse_sources_list_mirror(text) == "http://archive.example/debian"
    assert apt_mirror.parse_sources_list_mirror("deb http://archive.ubuntu.com/ubuntu jammy main\n") is None
    assert apt_mirror.parse_sources_list_mirror("deb mirror+file:/etc/apt/mirrors.txt bookworm main\n") is None


def test_find_apt_mirror(tmp_path: Path) -> None:
    assert apt_mirror.find_apt_mirror(tmp_path) == apt_mirror.DEFAULT_MIRROR
    (tmp_path / "sources.list").write_text(SOURCES_LIST)
    assert apt_mirror.find_apt_mirror(tmp_path) == "http://ftp.de.debian.org/debian"
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "a-nodesource.sources").write_text(DEB822_NODESOURCE)
    (d / "debian.sources").write_text(DEB822)
    (d / "debian.sources.disabled").write_text(DEB822_SECURITY_FIRST_AND_MIRROR)
    # deb822 files win over sources.list; unrelated and disabled files are skipped
    assert apt_mirror.find_apt_mirror(tmp_path) == "http://deb.debian.org/debian"


FILES = {
    "Dockerfile": b"ARG BASE=python:3.12-slim\nFROM ${BASE}\n",
    "requirements.txt": b"ipykernel\nnumpy\n",
    "start-kernel": b'#!/bin/sh\nexec python -m ipykernel_launcher -f "$1"\n',
}


def test_build_hash_is_stable() -> None:
    h = context.compute_build_hash(FILES, "sha256:aaa")
    assert h == context.compute_build_hash(dict(reversed(list(FILES.items()))), "sha256:aaa")
    assert len(h) == 64 and int(h, 16) >= 0


def test_build_hash_changes_with_inputs() -> None:
    h = context.compute_build_hash(FILES, "sha256:aaa")
    changed_dockerfile = dict(FILES, Dockerfile=FILES["Dockerfile"] + b"USER 1000\n")
    assert context.compute_build_hash(changed_dockerfile, "sha256:aaa") != h
    changed_reqs = dict(FILES, **{"requirements.txt": b"ipykernel\nnumpy\npandas\n"})
    assert context.compute_build_hash(changed_reqs, "sha256:aaa") != h
    assert context.compute_build_hash(FILES, "sha256:bbb") != h
    # moving bytes from one file to the next must not collide
    shifted = dict(
        FILES, Dockerfile=FILES["Dockerfile"][:-1], **{"requirements.txt": b"\n" + FILES["requirements.txt"]}
    )
    assert context.compute_build_hash(shifted, "sha256:aaa") != h


def test_build_hash_of_the_real_context(tmp_path: Path) -> None:
    files = context.read_context_files(context.default_image_dir())
    assert set(files) == set(context.context_names(context.default_image_dir()))
    assert {"Dockerfile", "start-kernel", "kernelgw_kernel/__init__.py", "kernelgw_kernel/fs.py"} <= set(files)
    h = context.compute_build_hash(files, "sha256:x")
    assert context.compute_build_hash(context.read_context_files(context.default_image_dir()), "sha256:x") == h
    with pytest.raises(image.ImageBuildError, match="Missing build input"):
        context.read_context_files(tmp_path)


def test_manylinux_platforms() -> None:
    tags = image.manylinux_platforms("x86_64", (2, 36))
    assert tags[0] == "manylinux_2_36_x86_64"
    assert "manylinux_2_17_x86_64" in tags and "manylinux_2_5_x86_64" in tags
    assert "manylinux_2_37_x86_64" not in tags
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    arm = image.manylinux_platforms("aarch64", (2, 31))
    assert arm[0] == "manylinux_2_31_aarch64" and arm[-1] == "manylinux2014_aarch64"
    assert "manylinux_2_16_aarch64" not in arm and not any("manylinux1" in t for t in arm)


def test_packages_from_wheels() -> None:
    names = [
        "numpy-2.1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "matplotlib_inline-0.1.7-py3-none-any.whl",
        "python_dateutil-2.9.0.post0-py2.py3-none-any.whl",
        "README.txt",
    ]
    assert image.packages_from_wheels(names) == {
        "matplotlib-inline": "0.1.7",
        "numpy": "2.1.0",
        "python-dateutil": "2.9.0.post0",
    }


def test_parse_step() -> None:
    assert (
        docker_build.parse_step("Step 3/12 : RUN python3 -m venv /opt/kernel")
        == "Step 3/12 : RUN python3 -m venv /opt/kernel"
    )
    assert docker_build.parse_step(" ---> Running in 1234") is None


def test_errors_are_kernelgw_errors() -> None:
    err = image.WheelDownloadError("pip failed", "line1\nline2\n")
    assert isinstance(err, image.ImageBuildError) and isinstance(err, KernelGWError)
    assert "line2" in err.message and err.log_tail.endswith("line2\n")
    assert isinstance(image.BaseImageError("x"), image.ImageBuildError)


def test_result_is_frozen() -> None:
    r = image.ImageBuildResult("t", "sha256:1", False, "b", 0.1)
    with pytest.raises(AttributeError):
        r.built = True  # type: ignore[misc]


def test_public_api() -> None:
    """What the CLI, the runtime and the tests import; the modules behind it may move."""
    assert set(image.__all__) == {
        "DEFAULT_TAG",
        "HASH_LABEL",
        "BaseImageError",
        "ImageBuildError",
        "ImageBuildResult",
        "WheelDownloadError",
        "build_bundle_image",
        "build_image",
        "build_kernel_image",
        "language_dir",
        "cache_dir",
        "image_exists",
        "manylinux_platforms",
        "packages_from_wheels",
        "pip_command",
        "pip_download_command",
    }
    assert all(getattr(image, name) is not None for name in image.__all__)
    assert image.pip_command()[-2:] == ["-m", "pip"] or image.pip_command()[0].endswith(("pip", "pip3"))


def test_wheel_downloads_target_the_image_python_and_platforms(tmp_path: Path) -> None:
    """The image build and session package installs resolve with one command:
    the image's Python and platforms, binary wheels only, the cache first."""
    cmd = image.pip_download_command(
        "3.11", ["manylinux_2_36_x86_64", "manylinux2014_x86_64"], tmp_path / "d", tmp_path / "c", tmp_path / "r.txt"
    )
    assert cmd[: len(image.pip_command())] == image.pip_command()
    assert cmd[len(image.pip_command())] == "download"
    assert "--only-binary=:all:" in cmd
    assert cmd[cmd.index("--python-version") + 1] == "3.11"
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--platform"] == [
        "manylinux_2_36_x86_64",
        "manylinux2014_x86_64",
    ]
    assert cmd[cmd.index("--dest") + 1] == str(tmp_path / "d")
    assert cmd[cmd.index("--find-links") + 1] == str(tmp_path / "c")
    assert cmd[cmd.index("--requirement") + 1] == str(tmp_path / "r.txt")


def test_every_file_of_the_kernel_package_is_a_build_input() -> None:
    """A module added to kernelgw_kernel is copied into the image and is part of its
    build hash (a fixed list once missed one: the image then loaded the extension
    without it). Only modules: the wheel ships ``kernelgw_kernel/*.py``."""
    image_dir = context.default_image_dir()
    package = {
        str(p.relative_to(image_dir))
        for p in (image_dir / "kernelgw_kernel").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    names = set(context.context_names(image_dir))
    assert package and package <= names, package - names
