"""Mounting the stream pipeline's cloud end (edgerun.stream.cloud, owned by the stream area) in this server.

The tunnel authenticates with the fleet's own device tokens and admin token, so one enrolment serves both.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from fastapi import APIRouter

from edgerun.fleet.service import FleetService
from edgerun.stream.cloud import build_router


def stream_router(service: FleetService, engine: sa.Engine, is_admin: Callable[[str], bool]) -> APIRouter:
    def verify_device(device_id: str, token: str) -> bool:
        return service.device_for_token(token) == device_id

    return build_router(engine, verify_device=verify_device, verify_admin=is_admin)
