"""Graph passes, one per file. `default_pipeline()` is what export runs."""

from edgerun.passes.base import Pass, PassRecord, PassResult, run_pipeline

__all__ = ["Pass", "PassRecord", "PassResult", "run_pipeline"]
