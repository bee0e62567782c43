"""The generated documentation pages match the code: the settings reference
(docs/operating/configuration.md, from kernelgw/config.py) and the OpenAPI document
(docs/reference/openapi.json, from the app). A change to either side without
regenerating fails here, with the command that regenerates them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_pages_are_up_to_date() -> None:
    gen_docs = _gen_docs()
    for path, text in gen_docs.generated().items():
        name = path.relative_to(ROOT)
        assert path.exists(), f"{name} is missing: run `{gen_docs.COMMAND}`"
        assert path.read_text(encoding="utf-8") == text, f"{name} is stale: run `{gen_docs.COMMAND}` and commit it"


def test_every_setting_is_in_the_reference() -> None:
    from kernelgw.config import Settings

    page = (ROOT / "docs" / "operating" / "configuration.md").read_text(encoding="utf-8")
    missing = [name for name in Settings.model_fields if f"| `{name}` | `KERNELGW_{name.upper()}` |" not in page]
    assert not missing, f"settings without a row: {missing}"
