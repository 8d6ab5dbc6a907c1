"""Ed25519 signing in the TUF/Uptane style: a root document names the keys of each role, and every
metadata document is an envelope {"signed": ..., "signatures": [...]} checked against that root.

Roles: `root` (offline; signs root documents, so it is what rotates every other key), `release`
(offline; signs each release manifest), `assignment` (online, held by the server; signs each device's
assignment). A device trusts one root document and follows the chain of newer roots, each signed by
the previous root's keys and its own, so keys can rotate without reflashing devices.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edgerun.fleet.canonical import canonical_bytes, iso_after, parse_iso, utc_now
from edgerun.fleet.errors import ExpiredError, FleetError, RollbackAttackError, SignatureError

ROLES = ("root", "release", "assignment")
ROOT_LIFETIME_S = 10 * 365 * 86400


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public: Ed25519PublicKey) -> str:
    return hashlib.sha256(_raw_public(public)).hexdigest()


@dataclass(frozen=True)
class SigningKey:
    """A private key with its id; `sign` produces one signature entry of an envelope."""

    private: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: str | Path) -> SigningKey:
        raw = bytes.fromhex(Path(path).read_text().strip())
        return cls(Ed25519PrivateKey.from_private_bytes(raw))

    def save(self, path: str | Path) -> None:
        raw = self.private.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        p = Path(path)
        p.write_text(raw.hex() + "\n")
        p.chmod(0o600)

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()

    @cached_property
    def keyid(self) -> str:  # cached: the server signs a timestamp on every "up to date" check-in
        return key_id(self.public)

    def public_entry(self) -> dict[str, str]:
        return {"keytype": "ed25519", "public": _raw_public(self.public).hex()}

    def signature(self, signed: dict[str, Any]) -> dict[str, str]:
        sig = self.private.sign(canonical_bytes(signed))
        return {"keyid": self.keyid, "sig": base64.b64encode(sig).decode()}


def sign_envelope(signed: dict[str, Any], keys: list[SigningKey]) -> dict[str, Any]:
    return {"signed": signed, "signatures": [k.signature(signed) for k in keys]}


def build_root(version: int, role_keys: dict[str, list[SigningKey]], threshold: int = 1,
               lifetime_s: float = ROOT_LIFETIME_S) -> dict[str, Any]:
    """The signed part of a root document naming the public keys of every role."""
    keys: dict[str, dict[str, str]] = {}
    roles: dict[str, dict[str, Any]] = {}
    for role in ROLES:
        ids = []
        for k in role_keys[role]:
            keys[k.keyid] = k.public_entry()
            ids.append(k.keyid)
        roles[role] = {"keyids": sorted(ids), "threshold": threshold}
    return {"_type": "root", "version": version, "expires": iso_after(lifetime_s), "keys": keys, "roles": roles}


class Root:
    """A verified root document; answers 'is this envelope signed by role R?'."""

    def __init__(self, envelope: dict[str, Any]) -> None:
        signed = envelope.get("signed")
        if not isinstance(signed, dict) or signed.get("_type") != "root":
            raise SignatureError("not a root document")
        self.envelope = envelope
        self.signed: dict[str, Any] = signed
        self.version: int = int(signed["version"])
        self._keys = {kid: Ed25519PublicKey.from_public_bytes(bytes.fromhex(e["public"]))
                      for kid, e in signed["keys"].items()}

    def verify_role(self, envelope: dict[str, Any], role: str) -> dict[str, Any]:
        """Return envelope['signed'] if at least `threshold` distinct keys of `role` signed it."""
        spec = self.signed["roles"].get(role)
        if spec is None:
            raise SignatureError(f"root names no role {role!r}")
        signed = envelope.get("signed")
        if not isinstance(signed, dict):
            raise SignatureError("envelope has no signed part")
        message = canonical_bytes(signed)
        good: set[str] = set()
        for entry in envelope.get("signatures", []):
            kid = entry.get("keyid")
            if kid not in spec["keyids"] or kid in good:
                continue
            try:
                self._keys[kid].verify(base64.b64decode(entry["sig"]), message)
            except (InvalidSignature, ValueError, KeyError):
                continue
            good.add(kid)
        if len(good) < int(spec["threshold"]):
            raise SignatureError(f"{role} metadata lacks {spec['threshold']} valid signature(s) from trusted keys")
        return signed


def check_expiry(signed: dict[str, Any], what: str) -> None:
    if parse_iso(signed["expires"]) <= utc_now():
        raise ExpiredError(f"{what} expired at {signed['expires']}")


def verify_root_update(current: Root, new_envelope: dict[str, Any]) -> Root:
    """TUF root rotation: version N+1 must be signed by N's root keys and by its own."""
    new = Root(new_envelope)
    if new.version != current.version + 1:
        raise RollbackAttackError(f"root version {new.version} does not follow {current.version}")
    current.verify_role(new_envelope, "root")
    new.verify_role(new_envelope, "root")
    check_expiry(new.signed, f"root v{new.version}")
    return new


class KeyDir:
    """The admin's key folder: root.key, release.key, assignment.key and the root chain root/<N>.json.

    The server needs only the root chain and assignment.key; root.key and release.key are the offline keys.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def key_path(self, role: str) -> Path:
        return self.path / f"{role}.key"

    def key(self, role: str) -> SigningKey:
        p = self.key_path(role)
        if not p.exists():
            raise FleetError(f"no {role} key at {p}; run `edgerun fleet keys init --keys {self.path}`")
        return SigningKey.load(p)

    def root_chain(self) -> list[dict[str, Any]]:
        d = self.path / "root"
        if not d.is_dir():
            raise FleetError(f"no root documents under {d}; run `edgerun fleet keys init --keys {self.path}`")
        docs = sorted(d.glob("*.json"), key=lambda p: int(p.stem))
        return [json.loads(p.read_text()) for p in docs]

    def latest_root_path(self) -> Path:
        return self.path / "root.json"

    def _write_root(self, envelope: dict[str, Any]) -> None:
        (self.path / "root").mkdir(parents=True, exist_ok=True)
        text = json.dumps(envelope, indent=1, sort_keys=True)
        (self.path / "root" / f"{envelope['signed']['version']}.json").write_text(text)
        self.latest_root_path().write_text(text)

    def init(self) -> dict[str, Any]:
        if self.latest_root_path().exists():
            raise FleetError(f"{self.path} already holds keys; use `edgerun fleet keys rotate`")
        self.path.mkdir(parents=True, exist_ok=True)
        keys = {role: SigningKey.generate() for role in ROLES}
        for role, k in keys.items():
            k.save(self.key_path(role))
        envelope = sign_envelope(build_root(1, {r: [k] for r, k in keys.items()}), [keys["root"]])
        self._write_root(envelope)
        return envelope

    def rotate(self, role: str) -> dict[str, Any]:
        """Replace the key of `role` and publish the next root version, signed by old and new root keys."""
        if role not in ROLES:
            raise FleetError(f"unknown role {role!r}; choose one of {', '.join(ROLES)}")
        current = Root(self.root_chain()[-1])
        keys = {r: self.key(r) for r in ROLES}
        old_root = keys["root"]
        fresh = SigningKey.generate()
        keys[role] = fresh
        signers = [old_root] if role != "root" else [old_root, fresh]
        envelope = sign_envelope(build_root(current.version + 1, {r: [k] for r, k in keys.items()}), signers)
        # Keep the old key beside the new one until the operator removes it on purpose.
        self.key_path(role).rename(self.path / f"{role}.key.v{current.version}")
        fresh.save(self.key_path(role))
        self._write_root(envelope)
        return envelope
