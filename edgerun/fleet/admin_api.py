"""The operator's half of the release server's HTTP API (/v1/admin): uploads, releases, audit, roots, overview."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from fastapi import APIRouter, Depends, HTTPException, Request

from edgerun.fleet import releases as rel
from edgerun.fleet.api_models import (
    DeviceGroups,
    DigestList,
    EnrolmentTokenRequest,
    PublishRequest,
    RootChain,
)
from edgerun.fleet.schema import audit, devices, releases, reports
from edgerun.fleet.service import FleetService
from edgerun.fleet.store import BlobStore, check_digest


def build_admin_router(engine: sa.Engine, service: FleetService, store: BlobStore,
                       kick_simulator: Callable[[], None], require_admin: Callable[[Request], str]) -> APIRouter:
    """Every route here needs the admin token; a device token gets 403."""
    admin = APIRouter(prefix="/v1/admin", dependencies=[Depends(require_admin)])

    @admin.put("/blobs/{digest}")
    async def put_blob(digest: str, request: Request) -> dict[str, str]:
        store.put(check_digest(digest), await request.body())
        return {"sha256": digest}

    @admin.post("/blobs/missing")
    def missing_blobs(body: DigestList) -> dict[str, list[str]]:
        return {"missing": [d for d in body.digests if not store.exists(check_digest(d))]}

    @admin.get("/tasks/{task}/stable")
    def stable(task: str) -> dict[str, Any]:
        return {"envelope": rel.latest_good_manifest(engine, task)}

    @admin.post("/releases")
    def publish(body: PublishRequest, actor: str = Depends(require_admin)) -> dict[str, Any]:
        release_id = rel.publish(engine, service.root(), store, body.envelope, body.rollback_envelope,
                                 body.policy, actor)
        service.invalidate()
        kick_simulator()
        return rel.describe(engine, release_id)

    @admin.get("/releases")
    def list_releases() -> list[dict[str, Any]]:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(releases).order_by(releases.c.id.desc())).all()
        return [rel.describe_row(r) for r in rows]

    @admin.get("/releases/{release_id}")
    def get_release(release_id: int) -> dict[str, Any]:
        return rel.describe(engine, release_id)

    @admin.post("/releases/{release_id}/{action}")
    def control(release_id: int, action: str, actor: str = Depends(require_admin)) -> dict[str, Any]:
        out = rel.control(engine, release_id, action, actor)
        service.invalidate()
        return out

    @admin.get("/audit")
    def audit_log(release_id: int | None = None) -> list[dict[str, Any]]:
        q = sa.select(audit).order_by(audit.c.id)
        if release_id is not None:
            q = q.where(audit.c.release_id == release_id)
        with engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(q)]

    @admin.get("/devices/{device_id}")
    def device_detail(device_id: str) -> dict[str, Any]:
        with engine.connect() as conn:
            row = conn.execute(sa.select(devices).where(devices.c.id == device_id)).first()
            if row is None:
                raise HTTPException(404, f"no device {device_id!r}")
            counts = conn.execute(sa.select(reports.c.outcome, sa.func.count()).where(reports.c.device_id == device_id)
                                  .group_by(reports.c.outcome)).all()
        return {"id": row.id, "profile": row.profile, "device_groups": row.device_groups, "last_seen": row.last_seen,
                "reports": {outcome: n for outcome, n in counts}}

    @admin.post("/enrolment-tokens")
    def create_enrolment_token(body: EnrolmentTokenRequest) -> dict[str, Any]:
        token = service.create_enrolment_token(device_id=body.device_id, device_groups=body.device_groups,
                                               uses=body.uses, ttl_s=body.ttl_s, label=body.label)
        return {"token": token, "device_id": body.device_id, "device_groups": sorted(set(body.device_groups)),
                "uses": body.uses, "ttl_s": body.ttl_s}

    @admin.put("/devices/{device_id}/groups")
    def set_device_groups(device_id: str, body: DeviceGroups) -> dict[str, Any]:
        return {"id": device_id, "device_groups": service.set_device_groups(device_id, body.device_groups)}

    @admin.post("/devices/{device_id}/revoke")
    def revoke_device(device_id: str) -> dict[str, Any]:
        if not service.revoke_device(device_id):
            raise HTTPException(404, f"no device {device_id!r}")
        return {"id": device_id, "revoked": True}

    @admin.post("/roots")
    def add_roots(body: RootChain) -> dict[str, int]:
        return {"root_version": service.add_roots(body.chain)}

    @admin.get("/overview")
    def overview() -> dict[str, Any]:
        return overview_data(engine)

    return admin


def _last_runs(conn: sa.Connection, device_ids: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per device and task, the version of its latest reported run and when the report came.

    The device table's `tasks` is what the device had installed at its last check-in; an agent on the push
    stream checks in when nudged (or every 300 s), installs after that, and reports each run, so its reports
    are the fresher word on what it runs (a rollback's version shows once it has run) and on when it was last
    heard from."""
    if not device_ids:
        return {}
    latest = (sa.select(reports.c.device_id, reports.c.task, sa.func.max(reports.c.received_at).label("at"))
              .where(reports.c.device_id.in_(device_ids)).group_by(reports.c.device_id, reports.c.task).subquery())
    rows = conn.execute(sa.select(reports.c.device_id, reports.c.task, reports.c.version, latest.c.at)
                        .join(latest, sa.and_(reports.c.device_id == latest.c.device_id,
                                              reports.c.task == latest.c.task,
                                              reports.c.received_at == latest.c.at))).all()
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        best = out.setdefault(r.device_id, {}).get(r.task)
        if best is None or r.version > best["version"]:  # two reports in one flush share received_at
            out[r.device_id][r.task] = {"version": r.version, "at": r.at}
    return out


def overview_data(engine: sa.Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        rel_rows = conn.execute(sa.select(releases).order_by(releases.c.id.desc()).limit(100)).all()
        failed = sa.func.sum(sa.case((reports.c.outcome != "success", 1), else_=0))
        versions = conn.execute(sa.select(reports.c.task, reports.c.version, sa.func.count().label("runs"),
                                          failed.label("failures"), sa.func.avg(reports.c.latency_ms).label("lat"))
                                # cancelled runs say nothing of the version: counted neither way, as in
                                # add_report_batches
                                .where(reports.c.counted, reports.c.outcome != "cancelled")
                                .group_by(reports.c.task, reports.c.version)
                                .order_by(reports.c.task, reports.c.version.desc())).all()
        dev_rows = conn.execute(sa.select(devices.c.id, devices.c.profile, devices.c.last_seen)
                                .order_by(devices.c.last_seen.desc()).limit(200)).all()
        count = conn.execute(sa.select(sa.func.count()).select_from(devices)).scalar() or 0
        running = _last_runs(conn, [d.id for d in dev_rows])
    return {
        "now": time.time(),
        "releases": [rel.describe_row(r) for r in rel_rows],
        "versions": [{"task": v.task, "version": v.version, "runs": v.runs, "failures": int(v.failures or 0),
                      "failure_rate": int(v.failures or 0) / v.runs if v.runs else 0.0,
                      "mean_latency_ms": float(v.lat or 0.0)} for v in versions],
        "devices": [{"id": d.id, "app_version": d.profile.get("app_version", ""), "os": d.profile.get("os", ""),
                     "groups": list(d.profile.get("device_groups", [])) + list(d.profile.get("user_groups", [])),
                     "tasks": d.profile.get("tasks", {}),
                     "running": {task: run["version"] for task, run in running.get(d.id, {}).items()},
                     "last_seen": max([d.last_seen, *(run["at"] for run in running.get(d.id, {}).values())])}
                    for d in dev_rows],
        "device_count": count,
    }
