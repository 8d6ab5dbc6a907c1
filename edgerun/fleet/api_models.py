"""Request bodies of the release server's HTTP API (they also make up its OpenAPI spec)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Profile(BaseModel):
    device_id: str = Field(max_length=128)
    app_version: str = "0"
    os: str = ""
    device_groups: list[str] = []
    user_groups: list[str] = []
    tasks: dict[str, int] = {}


class RegisterRequest(BaseModel):
    enroll_token: str
    profile: Profile


class ReportItem(BaseModel):
    id: str = Field(max_length=64)
    task: str
    version: int
    outcome: str
    latency_ms: float = 0.0
    error: str = ""


class ReportBatch(BaseModel):
    reports: list[ReportItem]


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
