"""E2B templates as kernelgw kernels: which kernel and image a template id runs.

``code-interpreter-v1`` (the code interpreter SDK's default) and ``base`` (the
core SDK's) run the gateway's default Python kernel on its ``image``; the
``e2b_templates`` setting adds ids (or remaps these two) to a kernel name or
an image. Where the engine has the code-interpreter image (every language E2B's
code interpreter runs, `kernelgw.kernels.BUNDLES`), an unmapped
``code-interpreter-v1`` runs that instead (`for_create`), as E2B's does. Any other id is E2B's 404, as E2B answers a template it does not have.

The template a sandbox was created from is kept in its metadata under
`TEMPLATE_KEY` (persisted with the session, copied to a fork), so its
``templateID`` survives a gateway restart; a session made on another face has
none and is named by what it runs.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, replace

from kernelgw.config import Settings
from kernelgw.kernels import CODE_INTERPRETER_BUNDLE, DEFAULT_KERNEL, PROFILES, bundle_image
from kernelgw.runtime.backends.base import Backend
from kernelgw.runtime.session import KernelSession
from kernelgw.server.e2b.errors import E2BError
from kernelgw.server.e2b.models import RESERVED_PREFIX

CODE_INTERPRETER = "code-interpreter-v1"
BASE = "base"
BUILT_IN = (CODE_INTERPRETER, BASE)

TEMPLATE_KEY = RESERVED_PREFIX + "template"


@dataclass(frozen=True)
class Template:
    id: str
    kernel: str
    image: str | None
    """None: the kernel's own image (the gateway's ``kernel_image``)."""


def templates(settings: Settings) -> dict[str, Template]:
    """Every template id this gateway offers."""
    offered = {name: Template(name, DEFAULT_KERNEL, None) for name in BUILT_IN}
    for template_id, target in settings.e2b_templates.items():
        if target in PROFILES:
            offered[template_id] = Template(template_id, target, None)
        else:
            offered[template_id] = Template(template_id, DEFAULT_KERNEL, target)
    return offered


def resolve(settings: Settings, template_id: str) -> Template:
    """The template, or E2B's 404 naming the ones there are."""
    found = templates(settings).get(template_id)
    if found is None:
        raise E2BError(
            404,
            f"Template {template_id!r} not found: this kernelgw gateway offers {sorted(templates(settings))} "
            "(its e2b_templates setting maps more template ids to kernels or images)",
            error_code="template_not_found",
        )
    return found


BUNDLE_CHECK_S = 10.0
"""How long the engine's answer to "is the code-interpreter image there" is kept."""
_bundle_seen: weakref.WeakKeyDictionary[Backend, tuple[float, bool]] = weakref.WeakKeyDictionary()


async def has_bundle(backend: Backend) -> bool:
    """Whether the engine has the code-interpreter image (asked every few seconds at most)."""
    now = time.monotonic()
    seen = _bundle_seen.get(backend)
    if seen is None or now - seen[0] > BUNDLE_CHECK_S:
        seen = (now, await backend.image_labels(bundle_image(CODE_INTERPRETER_BUNDLE)) is not None)
        _bundle_seen[backend] = seen
    return seen[1]


async def for_create(settings: Settings, backend: Backend, template: Template) -> Template:
    """``template`` as a new sandbox runs it: an unmapped ``code-interpreter-v1``
    runs the code-interpreter image where the engine has it (built by
    ``kernelgw image build --kernel code-interpreter``), else the Python one."""
    if template.id != CODE_INTERPRETER or CODE_INTERPRETER in settings.e2b_templates:
        return template
    if not await has_bundle(backend):
        return template
    return replace(template, image=bundle_image(CODE_INTERPRETER_BUNDLE))


def template_of(session: KernelSession, settings: Settings) -> str:
    """The template id a sandbox answers with: the one it was created from, else
    the first that runs what it runs, else its image."""
    return template_for(session.metadata, session.spec.kernel, session.spec.image, settings)


def template_for(metadata: Mapping[str, str], kernel: str, image: str, settings: Settings) -> str:
    """`template_of` for what a session's store row holds (another gateway's sandbox)."""
    kept = metadata.get(TEMPLATE_KEY)
    if kept:
        return kept
    for template in templates(settings).values():
        if template.kernel == kernel and (template.image or settings.kernel_image(template.kernel)) == image:
            return template.id
    return image
