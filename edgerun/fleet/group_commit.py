"""Group commit of run reports: requests that arrive together share one database transaction.

Each request is answered only after the transaction holding its reports has committed, so an
acknowledged report is durable (the agent deletes it from its outbox on that answer), while a busy
server pays one commit and one rollout evaluation per group instead of per request. A group whose
transaction fails is retried one request at a time, so one request's failure is only its own.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi.concurrency import run_in_threadpool

from edgerun.fleet.service import FleetService

Batch = tuple[str, list[dict[str, Any]], "asyncio.Future[int]"]


class ReportGroupCommit:
    def __init__(self, service: FleetService, gather_s: float = 0.005) -> None:
        self.service = service
        self.gather_s = gather_s
        self._pending: list[Batch] = []
        self._flusher: asyncio.Task[None] | None = None

    async def submit(self, device_id: str, items: list[dict[str, Any]]) -> int:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending.append((device_id, items, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        while self._pending:
            await asyncio.sleep(self.gather_s)  # let the requests arriving together join the group
            group, self._pending = self._pending, []
            try:
                counts = await run_in_threadpool(self.service.add_report_batches, [(d, items) for d, items, _ in group])
            except Exception as exc:
                if len(group) == 1:
                    _settle(group[0][2], exc)
                    continue
                for device_id, items, future in group:  # alone, each request commits or fails on its own
                    try:
                        _settle(future, await run_in_threadpool(self.service.add_reports, device_id, items))
                    except Exception as alone:
                        _settle(future, alone)
                continue
            for (_, _, future), n in zip(group, counts):
                _settle(future, n)


def _settle(future: asyncio.Future[int], outcome: int | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
