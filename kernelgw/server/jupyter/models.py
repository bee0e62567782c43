"""The request bodies of Jupyter's kernels REST API, validated at the edge."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kernelgw.models import check_env

Body = TypeVar("Body", bound=BaseModel)

ENV_PREFIX = "KERNEL_"


class StartKernel(BaseModel):
    """``POST /api/kernels``: what Jupyter Server and Kernel Gateway clients send.

    ``env`` takes only ``KERNEL_*`` variables (the gateway convention); they are
    set in the kernel's environment. ``KERNEL_WORKING_DIR`` names a directory on
    the *client's* machine and is not applied (the kernel always starts in its
    sandbox's ``/workspace``). ``path`` is accepted and ignored, as Kernel
    Gateway does. Any other field is refused."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, max_length=200, description="A kernelspec name; the default one if absent.")
    env: dict[str, str] = Field(default_factory=dict, description="KERNEL_* variables for the kernel.")
    path: str | None = Field(None, max_length=4096, description="The notebook's path (ignored).")

    @field_validator("env")
    @classmethod
    def _kernel_env(cls, env: dict[str, str]) -> dict[str, str]:
        other = sorted(k for k in env if not k.startswith(ENV_PREFIX))
        if other:
            shown = ", ".join(repr(k[:60]) for k in other[:5])
            raise ValueError(f"only KERNEL_* variables are accepted; got {shown}")
        return check_env(env)  # the /v1 rules: names, NUL, sizes


def json_body(model: type[Body]) -> Callable[[Request], Awaitable[Body | None]]:
    """A dependency reading the request's body as JSON whatever its content type
    (None when empty): JupyterLab's client (@jupyterlab/services) posts JSON
    strings through ``fetch``, which labels them ``text/plain``, and Jupyter
    Server reads them all the same."""

    async def parse(request: Request) -> Body | None:
        raw = await request.body()
        if not raw.strip():
            return None
        try:
            return model.model_validate_json(raw)
        except ValidationError as exc:
            errors = [{"loc": ("body", *e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
            raise RequestValidationError(errors) from None

    return parse
