"""Graph passes, one per file. `default_pipeline()` is what export runs."""

from edgerun.passes.base import Pass, PassRecord, PassResult, run_pipeline
from edgerun.passes.common_subexpression_pass import CommonSubexpressionPass
from edgerun.passes.constant_fold_pass import ConstantFoldPass
from edgerun.passes.conv_affine_fold_pass import ConvAffineFoldPass
from edgerun.passes.dead_code_pass import DeadCodePass
from edgerun.passes.decompose_pass import DecomposePass
from edgerun.passes.pipeline import (
    METADATA_KEY,
    default_pipeline,
    format_pass_table,
    optimize,
    records_from_json,
    records_to_json,
)
from edgerun.passes.raster_merge_pass import RasterMergePass

__all__ = [
    "METADATA_KEY",
    "CommonSubexpressionPass",
    "ConstantFoldPass",
    "ConvAffineFoldPass",
    "DeadCodePass",
    "DecomposePass",
    "Pass",
    "PassRecord",
    "PassResult",
    "RasterMergePass",
    "default_pipeline",
    "format_pass_table",
    "optimize",
    "records_from_json",
    "records_to_json",
    "run_pipeline",
]
