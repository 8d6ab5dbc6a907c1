"""Entry point for `uvicorn --factory` with several worker processes; the config comes from the environment."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from fastapi import FastAPI

from edgerun.fleet.server import ServerConfig, create_app

ENV = "EDGERUN_FLEET_SERVER_CONFIG"


def config_to_env(cfg: ServerConfig) -> str:
    return json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()})


def app_from_env() -> FastAPI:
    raw = json.loads(os.environ[ENV])
    raw["data_dir"], raw["keys_dir"] = Path(raw["data_dir"]), Path(raw["keys_dir"])
    return create_app(ServerConfig(**raw))
