"""Progress bars for long command-line runs, by tqdm (``pip install shardstore[progress]``).

A bar is drawn only where someone watches: on a terminal (stderr by default), and
only once a run has lasted :data:`DELAY` seconds. Into a pipe or a log file, with
tqdm missing, or when disabled (``--quiet``) nothing at all is written::

    with progress(total_bytes, "checking shards", enabled=not args.quiet) as bar:
        for blob in blobs:
            ...
            bar.update(len(blob))

:class:`StageProgress` adapts the ``(what, done, total)`` callbacks of
:mod:`shardstore.maintenance` to one such bar per stage.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Protocol, TextIO

__all__ = ["DELAY", "Bar", "StageProgress", "progress", "wanted"]

DELAY = 1.0
"""Seconds a run lasts before its bar appears: short runs show none."""


class Bar(Protocol):
    """What :func:`progress` yields."""

    def update(self, nbytes: int) -> None:
        """``nbytes`` more bytes done."""

    def set_total(self, total_bytes: int | None) -> None:
        """The total, once known or when it changes (None: unknown)."""


class _NoBar:
    def update(self, nbytes: int) -> None:
        pass

    def set_total(self, total_bytes: int | None) -> None:
        pass


class _TqdmBar:
    def __init__(self, bar: Any) -> None:
        self._bar = bar

    def update(self, nbytes: int) -> None:
        if nbytes:
            self._bar.update(nbytes)

    def set_total(self, total_bytes: int | None) -> None:
        self._bar.total = total_bytes
        self._bar.refresh()


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # the extra is not installed: no bars, no complaint
        return None
    return tqdm


def wanted(enabled: bool | None = None, file: TextIO | None = None) -> bool:
    """Whether :func:`progress` would draw: ``enabled`` if given, else whether ``file``
    (default stderr) is a terminal; never without tqdm."""
    if _tqdm() is None:
        return False
    if enabled is not None:
        return enabled
    stream = sys.stderr if file is None else file
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


@contextmanager
def progress(
    total_bytes: int | None,
    description: str,
    enabled: bool | None = None,
    *,
    file: TextIO | None = None,
    delay: float | None = None,
) -> Iterator[Bar]:
    """A byte-counting progress bar (sizes scaled to KiB/MiB/..., with a rate) on ``file``
    (default: stderr), closed on leaving the block.

    ``enabled``: True draws it (wherever ``file`` is: tests pass a StringIO), False
    never, None (the default) only if ``file`` is a terminal. Without tqdm the bar
    is a no-op whatever ``enabled`` says. ``delay``: seconds before it first
    appears (default :data:`DELAY` for automatic bars, 0 for ones asked for)."""
    stream = sys.stderr if file is None else file
    tqdm = _tqdm()
    if tqdm is None or not wanted(enabled, stream):
        yield _NoBar()
        return
    bar = tqdm(
        total=total_bytes,
        desc=description,
        file=stream,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        dynamic_ncols=True,
        leave=False,
        delay=(DELAY if enabled is None else 0.0) if delay is None else delay,
    )
    try:
        yield _TqdmBar(bar)
    finally:
        bar.close()


class StageProgress:
    """A callback ``(what, done, total)`` (bytes done of total in the stage ``what``, as
    :mod:`shardstore.maintenance` reports them) drawing one :func:`progress` bar per
    stage; use it as a context manager so that the last bar is closed.

    ``descriptions`` names the stages on the bars (default: the stage's own name)."""

    def __init__(
        self,
        enabled: bool | None = None,
        descriptions: Mapping[str, str] | None = None,
        *,
        file: TextIO | None = None,
        delay: float | None = None,
    ) -> None:
        self._enabled = wanted(enabled, file)
        self._explicit = enabled is not None
        self._descriptions = dict(descriptions or {})
        self._file = file
        self._delay = delay
        self._stage: str | None = None
        self._bar: Bar = _NoBar()
        self._open: Any = None
        self._done = 0
        self._total = 0

    @property
    def enabled(self) -> bool:
        return self._enabled

    def __call__(self, what: str, done: int, total: int) -> None:
        if not self._enabled:
            return
        if what != self._stage:
            self.close()
            self._stage, self._done = what, 0
            self._open = progress(
                total,
                self._descriptions.get(what, what),
                True if self._explicit else None,
                file=self._file,
                delay=self._delay,
            )
            self._bar = self._open.__enter__()
            self._total = total
        if total != self._total:
            self._bar.set_total(total)
            self._total = total
        self._bar.update(done - self._done)
        self._done = done

    def close(self) -> None:
        if self._open is not None:
            opened, self._open, self._bar, self._stage = self._open, None, _NoBar(), None
            opened.__exit__(None, None, None)

    def __enter__(self) -> StageProgress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
