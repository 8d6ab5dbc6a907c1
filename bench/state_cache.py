"""A KV-cache-like buffer as program state against the same cache passed in and out (docs/runtime.md).

Workload: a cache of `--rows` x `--width` float32; each call embeds `--new` rows (a Linear) and writes them
into the cache at fixed rows, returning the last row's projection. Three programs of the same module:
  io        the cache is an input and the new cache an output (what a static program without state does:
            copy the cache in, compute, copy the new cache out, and the caller feeds it back)
  state     the cache is a mutated buffer, i.e. program state (edgerun.export): a read is a view, the
            update is planned in place, and the raster writes only the new rows
  state+where  the write at a run-time position (torch.where(arange == pos, k, cache)): elementwise over
            the whole cache, then one copy into the state buffer
  state+index  the same write as `cache.index_copy_(0, pos, k)`: update_slice, one row written in place
Median seconds per call on the reference backend; the ratio is against `io`.

    .venv/bin/python bench/state_cache.py [--rows 4096] [--width 256] [--new 4] [--repeats 200]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import edgerun


class CacheIO(nn.Module):
    def __init__(self, width: int, new: int) -> None:
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.new = new

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.embed(x)
        return k[-1:], torch.cat([k, cache[self.new:]], 0)


class CacheState(CacheIO):
    def __init__(self, width: int, new: int, rows: int) -> None:
        super().__init__(width, new)
        self.register_buffer("cache", torch.zeros(rows, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        k = self.embed(x)
        self.cache[: self.new] = k
        return k[-1:]


class CacheIndex(CacheState):
    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        k = self.embed(x)
        self.cache.index_copy_(0, pos, k)
        return k


class CacheWhere(CacheState):
    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        k = self.embed(x)
        row = (torch.arange(self.cache.shape[0]) == pos).unsqueeze(1)
        self.cache.copy_(torch.where(row, k, self.cache))
        return k


def median_call(call: Any, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--new", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    rows, width, new = args.rows, args.width, args.new
    torch.manual_seed(0)
    x = torch.randn(new, width)
    io = edgerun.load(edgerun.export(CacheIO(width, new), (x, torch.zeros(rows, width))))
    state = edgerun.load(edgerun.export(CacheState(width, new, rows), (x,)))
    where = edgerun.load(edgerun.export(CacheWhere(width, 1, rows), (torch.randn(1, width), torch.tensor(3))))
    index = edgerun.load(edgerun.export(CacheIndex(width, 1, rows), (torch.randn(1, width), torch.tensor([3]))))
    xs, cache, x1, pos = x.numpy(), np.zeros((rows, width), np.float32), np.ones((1, width), np.float32), \
        np.array(3)

    def call_io() -> None:
        nonlocal cache
        _, cache = io(xs, cache)

    results = {
        "io": median_call(call_io, args.repeats),
        "state": median_call(lambda: state(xs), args.repeats),
        "state+where": median_call(lambda: where(x1, pos), args.repeats),
        "state+index": median_call(lambda: index(x1, pos.reshape(1)), args.repeats),
    }
    in_place = {name: list(m.parts.state.plan.in_place) if m.parts.state else []
                for name, m in (("state", state), ("state+where", where), ("state+index", index))}
    cache_mb = rows * width * 4 / 1e6
    print(f"cache {rows}x{width} float32 ({cache_mb:.1f} MB), {new} new rows per call, reference backend")
    print(f"{'program':<14}{'median ms':>12}{'vs io':>8}  in place")
    for name, seconds in results.items():
        print(f"{name:<14}{seconds * 1e3:>12.3f}{seconds / results['io']:>8.2f}  {in_place.get(name, '')}")
    out = Path(__file__).parent / "results" / "state_cache.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "width": width, "new": new, "repeats": args.repeats,
                               "median_s": results, "in_place": in_place, "machine": platform.machine()},
                              indent=2) + "\n")


if __name__ == "__main__":
    main()
