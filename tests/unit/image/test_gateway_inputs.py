"""The gateway image's build inputs: what its content hash covers decides when
CI rebuilds it (every change to the package, never a byte-code file)."""

from __future__ import annotations

from pathlib import Path

from kernelgw.image.gateway import gateway_build_hash, source_files, source_root


def make_tree(root: Path) -> None:
    for name, text in {
        "pyproject.toml": "[project]\nname = 'kernelgw'\n",
        "README.md": "readme\n",
        "requirements/lock.txt": "httpx==1\n",
        "kernelgw/__init__.py": "",
        "kernelgw/config.py": "X = 1\n",
        "kernelgw/__pycache__/config.cpython-311.pyc": "bytecode",
        "images/python/Dockerfile": "FROM x\n",
        "images/python/wheels/numpy.whl": "wheel",
        "images/gateway/Dockerfile": "FROM y\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_source_files_are_the_wheel_inputs_only(tmp_path: Path) -> None:
    make_tree(tmp_path)
    assert sorted(source_files(tmp_path)) == [
        "README.md",
        "images/python/Dockerfile",
        "kernelgw/__init__.py",
        "kernelgw/config.py",
        "pyproject.toml",
        "requirements/lock.txt",
    ]


def test_the_hash_follows_every_input(tmp_path: Path) -> None:
    make_tree(tmp_path)
    gateway = {"Dockerfile": b"FROM y\n", "entrypoint.py": b"print()\n"}
    source = source_files(tmp_path)
    first = gateway_build_hash(gateway, source, "sha256:base")
    assert gateway_build_hash(dict(gateway), dict(source), "sha256:base") == first
    assert gateway_build_hash(gateway, {**source, "kernelgw/config.py": b"X = 2\n"}, "sha256:base") != first
    assert gateway_build_hash({**gateway, "entrypoint.py": b"pass\n"}, source, "sha256:base") != first
    assert gateway_build_hash(gateway, source, "sha256:other-base") != first
    # a file moving between the two groups is a change too
    assert (
        gateway_build_hash({}, {**source, **{f"images/gateway/{k}": v for k, v in gateway.items()}}, "sha256:base")
        != first
    )


def test_this_checkout_is_a_source_tree() -> None:
    root = source_root()
    assert (root / "images" / "gateway" / "Dockerfile").is_file()
    assert "kernelgw/image/gateway.py" in source_files(root)
