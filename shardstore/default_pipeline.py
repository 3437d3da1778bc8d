"""Making :class:`~shardstore.pipeline.ShardAwarePipeline` zarr's codec pipeline, so that
arrays on a ShardingStore get it with no configuration.

zarr picks a pipeline class from ``codec_pipeline.path`` whenever it opens an
array. While that setting is still zarr's default, shardstore points it at its
own pipeline, which builds zarr's batched pipeline, exactly as zarr would, for
arrays on any other store. A pipeline the user chose is left alone, and so is
zarr's setting with ``SHARDSTORE_DEFAULT_PIPELINE=0`` in the environment.
This is decided once per process: when shardstore is imported or, if zarr's
setting was something else then (zarr imports shardstore's pipeline while
loading its entry points, perhaps inside a user's temporary setting), when the
first ShardingStore is made. After that a user's choice, zarr's own path
included, is theirs.
"""

from __future__ import annotations

import os

import zarr

__all__ = ["OPT_OUT_VARIABLE", "PIPELINE_PATH", "ZARR_DEFAULT_PATH", "become_default"]

PIPELINE_PATH = "shardstore.pipeline.ShardAwarePipeline"
"""The value of zarr's ``codec_pipeline.path`` that selects shardstore's pipeline."""
ZARR_DEFAULT_PATH = "zarr.core.codec_pipeline.BatchedCodecPipeline"
"""zarr's own default ``codec_pipeline.path``."""
OPT_OUT_VARIABLE = "SHARDSTORE_DEFAULT_PIPELINE"
"""Set to 0 (or false, no, off) to keep zarr's codec pipeline setting as it is."""


_decided = False


def become_default(*, final: bool = True) -> None:
    """Point zarr's ``codec_pipeline.path`` at shardstore's pipeline if it is zarr's
    default and this has not been decided yet; ``final=False`` leaves the decision
    open when the setting is something else."""
    global _decided
    if _decided:
        return
    if os.environ.get(OPT_OUT_VARIABLE, "").strip().lower() in ("0", "false", "no", "off"):
        _decided = True
    elif zarr.config.get("codec_pipeline.path", None) == ZARR_DEFAULT_PATH:
        zarr.config.set({"codec_pipeline.path": PIPELINE_PATH})
        _decided = True
    else:
        _decided = final
