"""Request bodies of the release server's HTTP API (they also make up its OpenAPI spec)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from edgerun.fleet.device_id import DEVICE_ID_PATTERN

# What a run report may carry: the outcome names of the compute container (container.OUTCOMES, and any it
# adds later) are short lowercase words; a task name as `task pack` allows it; a run id as the agent makes it.
OUTCOME_PATTERN = r"^[a-z_]{1,16}$"
TASK_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
RUN_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
MAX_LATENCY_MS = 7 * 86400 * 1000.0
MAX_REPORTS_PER_BATCH = 500


class Profile(BaseModel):
    device_id: str = Field(max_length=128, pattern=DEVICE_ID_PATTERN)
    app_version: str = "0"
    os: str = ""
    device_groups: list[str] = []
    user_groups: list[str] = []
    tasks: dict[str, int] = {}
    idle: bool = Field(False, description="the device is not in use (federated jobs may train only on idle devices)")
    charging: bool = Field(False, description="the device is on external power (likewise)")


class CheckinRequest(Profile):
    serial: int = Field(0, ge=0, description=(
        "the highest assignment or timestamp serial the device has accepted: a server may answer 'up to date' "
        "with a timestamp it signed before, if its serial is not below this one (edgerun.fleet.freshness)"))


class RegisterRequest(BaseModel):
    enroll_token: str = Field(max_length=256)
    profile: Profile
    device_token: str | None = Field(None, min_length=32, max_length=256, description=(
        "the bearer token the device chose for itself (kept before enrolling, so a retry is recognised); "
        "without it the server makes one"))


class EnrolmentTokenRequest(BaseModel):
    device_id: str | None = Field(None, max_length=128, pattern=DEVICE_ID_PATTERN,
                                  description="only this device id may enrol with it")
    device_groups: list[str] = Field([], description="the groups (hardware class) the enrolled device gets")
    uses: int = Field(1, ge=1, le=1_000_000)
    ttl_s: float = Field(86400.0, gt=0, le=366 * 86400)
    label: str = Field("admin", max_length=64)


class DeviceGroups(BaseModel):
    device_groups: list[str]


class ReportItem(BaseModel):
    """One run; every field is checked here, so a bad report fails only the request that carries it."""

    id: str = Field(pattern=RUN_ID_PATTERN)
    task: str = Field(pattern=TASK_PATTERN)
    version: int = Field(ge=1, le=2**31 - 1)
    outcome: str = Field(pattern=OUTCOME_PATTERN)
    latency_ms: float = Field(0.0, ge=0.0, le=MAX_LATENCY_MS, allow_inf_nan=False)
    error: str = Field("", max_length=4000)


class ReportBatch(BaseModel):
    reports: list[ReportItem] = Field(max_length=MAX_REPORTS_PER_BATCH)


class PublishRequest(BaseModel):
    envelope: dict[str, Any]
    rollback_envelope: dict[str, Any]
    policy: dict[str, Any] = {}


class DigestList(BaseModel):
    digests: list[str]


class RootChain(BaseModel):
    chain: list[dict[str, Any]]


class CheckinAnswer(BaseModel):
    status: str = Field(description="'up-to-date' or 'update'")
    root_version: int
    assignment: dict[str, Any] | None = Field(None, description="signed assignment, when status is 'update'")
    timestamp: dict[str, Any] | None = Field(None, description=(
        "signed timestamp for this device, when status is 'up-to-date' (edgerun.fleet.freshness)"))
