"""The operator's side of the wire API: publish packages, steer releases, push rotated roots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from edgerun.fleet.errors import FleetError
from edgerun.fleet.manifest import sign_release, verify_release
from edgerun.fleet.package import read_package
from edgerun.fleet.signing import KeyDir, Root


class AdminClient:
    def __init__(self, server_url: str, token: str, timeout_s: float = 60.0) -> None:
        if not token:
            raise FleetError("an admin token is needed (--token-file or $EDGERUN_FLEET_TOKEN; "
                             "the server keeps it in DATA/admin_token)")
        self.http = httpx.Client(base_url=server_url.rstrip("/"), timeout=timeout_s,
                                 headers={"Authorization": f"Bearer {token}"})

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise FleetError(f"cannot reach the fleet server: {exc}") from exc
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text
            raise FleetError(f"server refused {method} {path} ({r.status_code}): {detail}")
        return r.json()

    def publish(self, package_path: str | Path, keys: KeyDir, policy: dict[str, Any]) -> dict[str, Any]:
        """Sign the release and its rollback with the offline release key, upload files, create the release."""
        package = read_package(package_path)
        root = Root(keys.root_chain()[-1])
        stable = self._call("GET", f"/v1/admin/tasks/{package.name}/stable")["envelope"]
        previous = verify_release(root, stable, task=package.name) if stable else None
        release_env, rollback_env = sign_release(package, previous, keys.key("release"))
        missing = self._call("POST", "/v1/admin/blobs/missing", json={"digests": sorted(package.blobs)})["missing"]
        for digest in missing:
            self._call("PUT", f"/v1/admin/blobs/{digest}", content=package.blobs[digest])
        merged = {**package.config.get("rollout", {}), **policy}
        return dict(self._call("POST", "/v1/admin/releases", json={
            "envelope": release_env, "rollback_envelope": rollback_env, "policy": merged}))

    def releases(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/admin/releases"))

    def release(self, release_id: int) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/admin/releases/{release_id}"))

    def control(self, release_id: int, action: str) -> dict[str, Any]:
        return dict(self._call("POST", f"/v1/admin/releases/{release_id}/{action}"))

    def audit(self, release_id: int | None = None) -> list[dict[str, Any]]:
        params = {"release_id": release_id} if release_id is not None else {}
        return list(self._call("GET", "/v1/admin/audit", params=params))

    def push_roots(self, keys: KeyDir) -> int:
        return int(self._call("POST", "/v1/admin/roots", json={"chain": keys.root_chain()})["root_version"])

    def overview(self) -> dict[str, Any]:
        return dict(self._call("GET", "/v1/admin/overview"))

    def device(self, device_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/admin/devices/{device_id}"))

    def enrolment_token(self, device_id: str | None = None, device_groups: tuple[str, ...] = (), uses: int = 1,
                        ttl_s: float = 86400.0) -> str:
        """Mint an enrolment token: single-use by default, optionally for one device id, with its groups."""
        body = {"device_id": device_id, "device_groups": list(device_groups), "uses": uses, "ttl_s": ttl_s}
        return str(self._call("POST", "/v1/admin/enrolment-tokens", json=body)["token"])

    def set_device_groups(self, device_id: str, device_groups: tuple[str, ...]) -> list[str]:
        body = {"device_groups": list(device_groups)}
        return list(self._call("PUT", f"/v1/admin/devices/{device_id}/groups", json=body)["device_groups"])

    def revoke_device(self, device_id: str) -> dict[str, Any]:
        return dict(self._call("POST", f"/v1/admin/devices/{device_id}/revoke"))
