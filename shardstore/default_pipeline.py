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
included, is theirs; but a choice made for speed (zarr's Fused pipeline, zarrs)
makes ShardingStore arrays several times slower, so the first chunk such a
pipeline reads or writes through a ShardingStore brings one
:class:`~shardstore.errors.PipelineChoiceWarning` per process, naming the two
settings that give both (unless shardstore's default was declined with the
variable below).
"""

from __future__ import annotations

import os
import warnings

import zarr

from shardstore.errors import PipelineChoiceWarning

__all__ = [
    "OPT_OUT_VARIABLE",
    "PIPELINE_PATH",
    "ZARR_DEFAULT_PATH",
    "become_default",
    "warn_if_another_pipeline",
]

PIPELINE_PATH = "shardstore.pipeline.ShardAwarePipeline"
"""The value of zarr's ``codec_pipeline.path`` that selects shardstore's pipeline."""
ZARR_DEFAULT_PATH = "zarr.core.codec_pipeline.BatchedCodecPipeline"
"""zarr's own default ``codec_pipeline.path``."""
OPT_OUT_VARIABLE = "SHARDSTORE_DEFAULT_PIPELINE"
"""Set to 0 (or false, no, off) to keep zarr's codec pipeline setting as it is."""


_decided = False
_warned = False


def _opted_out() -> bool:
    return os.environ.get(OPT_OUT_VARIABLE, "").strip().lower() in ("0", "false", "no", "off")


def become_default(*, final: bool = True) -> None:
    """Point zarr's ``codec_pipeline.path`` at shardstore's pipeline if it is zarr's
    default and this has not been decided yet; ``final=False`` leaves the decision
    open when the setting is something else."""
    global _decided
    if _decided:
        return
    if _opted_out():
        _decided = True
    elif zarr.config.get("codec_pipeline.path", None) == ZARR_DEFAULT_PATH:
        zarr.config.set({"codec_pipeline.path": PIPELINE_PATH})
        _decided = True
    else:
        _decided = final


def warn_if_another_pipeline(key: str) -> None:
    """Say once per process that another pipeline serves ShardingStore arrays; called
    for each chunk read or written one at a time (what every pipeline but
    shardstore's does), with the chunk's key."""
    global _warned
    if _warned:
        return
    path = zarr.config.get("codec_pipeline.path", None)
    if path == PIPELINE_PATH or _opted_out():
        return
    _warned = True
    warnings.warn(
        f"zarr's codec_pipeline.path is {path!r}, so arrays on a ShardingStore (first chunk: {key!r}) "
        "go through that pipeline one chunk at a time, several times slower than through shardstore's. "
        f"To keep {path!r} for every other array and give ShardingStore arrays shardstore's pipeline, "
        f"set codec_pipeline.path to {PIPELINE_PATH!r} and codec_pipeline.fallback_path to {path!r} "
        "(zarr.config.set, or the variables ZARR_CODEC_PIPELINE__PATH and "
        "ZARR_CODEC_PIPELINE__FALLBACK_PATH); said once per process",
        PipelineChoiceWarning,
        stacklevel=2,
    )
