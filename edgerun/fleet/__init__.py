"""Fleet release platform: task packages, signed metadata, a release server with staged rollout, a device agent.

Heavy dependencies (fastapi, sqlalchemy, httpx) are imported by the submodules that need them, never here,
so `import edgerun.fleet.signing` stays light enough for a device.
"""
