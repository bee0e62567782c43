"""Request and response bodies at the HTTP/WebSocket edge."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from kernelgw.events import DoneStatus, Event


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSession(_Body):
    memory_mb: int | None = Field(None, description="Memory limit in MiB (within the gateway's maximum).")
    cpus: float | None = Field(None, description="CPU quota in cores (within the gateway's maximum).")
    timeout: float | None = Field(None, description="Default per-execution timeout in seconds.")
    image: str | None = Field(None, description="Kernel image; must be one the gateway allows.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables for the kernel.")


class SessionInfo(BaseModel):
    id: str
    state: Literal["starting", "idle", "busy", "dead", "closed"]
    image: str
    runtime: str
    memory_mb: int
    cpus: float
    created_at: datetime
    last_activity: datetime
    execution_count: int
    queue_length: int
    subscribers: int
    last_seq: int
    dead_reason: str | None = None


class SessionList(BaseModel):
    sessions: list[SessionInfo]


class ExecuteRequest(_Body):
    code: str
    timeout: float | None = Field(None, description="Seconds before the cell is interrupted.")
    execution_id: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")


class ExecuteResponse(BaseModel):
    execution_id: str
    status: DoneStatus
    execution_count: int | None
    duration_ms: float
    events: list[Event]


class InterruptResponse(BaseModel):
    interrupted: bool


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    engine: bool
    image: bool
    image_name: str
    runtime: str
    sessions: int
    detail: str = ""


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorBody


# --- messages a WebSocket client sends


class WsExecute(_Body):
    type: Literal["execute"]
    code: str
    execution_id: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    timeout: float | None = None


class WsInterrupt(_Body):
    type: Literal["interrupt"]


WsMessage = Annotated[Union[WsExecute, WsInterrupt], Field(discriminator="type")]
