"""Region: the raster region type, read by name from the twelve stored integers."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from edgerun.ir.ops.raster import check_regions, strided_copy_regions
from edgerun.ir.region import Region, copied_elements, regions_of


def test_round_trip_and_named_fields() -> None:
    stored = [1, 5, 12, 4, 1, 0, 12, 3, 1, 2, 3, 4]
    r = Region.of(stored)
    assert (r.src, r.src_offset, r.src_strides, r.dst_offset, r.dst_strides, r.size) == \
        (1, 5, (12, 4, 1), 0, (12, 3, 1), (2, 3, 4))
    assert r.to_list() == stored and r.numel == 24
    assert copied_elements(regions_of({"regions": [stored, stored]})) == 48
    with pytest.raises(ValueError, match="12 integers"):
        Region.of(stored[:-1])


def test_identity_is_a_whole_in_order_copy_of_source_zero() -> None:
    (whole,) = [Region.of(r) for r in strided_copy_regions(0, 0, (12, 4, 1), 0, (12, 4, 1), (2, 3, 4))]
    assert whole.is_identity(24)
    assert not whole.is_identity(25)
    transposed = Region.of(strided_copy_regions(0, 0, (1, 4), 0, (6, 1), (4, 6))[0])
    assert not transposed.is_identity(24)
    assert not replace(whole, src=1).is_identity(24)


def test_views_and_index_grids_describe_the_same_copy() -> None:
    rng = np.random.default_rng(0)
    src = rng.standard_normal(40).astype(np.float32)
    r = Region(0, 39, (-10, -2, -1), 1, (8, 4, 1), (3, 2, 4))  # a reversing view
    check_regions([r.to_list()], [src.size], 30)
    by_view = np.zeros(30, np.float32)
    dst_view, src_view = r.views(src, by_view)
    np.copyto(dst_view, src_view)
    assert not src_view.flags.writeable
    by_index = np.zeros(30, np.float32)
    dst_idx, src_idx = r.index_grids()
    by_index[dst_idx] = src[src_idx]
    np.testing.assert_array_equal(by_view, by_index)
    assert r.extent("src") == (39 - 20 - 2 - 3, 39) and r.extent("dst") == (1, 1 + 16 + 4 + 3)
