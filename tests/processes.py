"""Writer processes for the several-writers tests.

Each race runs its writers in processes of their own (spawned, as dask's workers
are), started together at a barrier. Spawning one costs about a second of imports
(zarr, numpy, shardstore), so the processes are made once for each test process
(each pytest-xdist worker) and kept for every race; a race that fails or hangs
gets new ones for the next.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["SIZE", "Writers"]

SIZE = 4
"""Writers one race may have."""


class Writers:
    """Up to :data:`SIZE` spawned processes, each running one call of a race at a time."""

    def __init__(self) -> None:
        self._ctx = mp.get_context("spawn")
        self._manager: Any = None
        self._pool: Any = None

    def together(
        self, calls: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]], timeout_s: float = 120
    ) -> list[Any]:
        """Run each ``function(*args, start)`` in a process of its own, all at once:
        ``start`` is a barrier they all pass before writing. Their results, in order; an
        exception a call raises is raised here.

        A process waiting at the barrier takes no other call, so each call has a
        process to itself."""
        assert 0 < len(calls) <= SIZE
        if self._pool is None:
            self._manager = self._ctx.Manager()
            self._pool = self._ctx.Pool(SIZE)
        start = self._manager.Barrier(len(calls))
        pending = [self._pool.apply_async(function, (*args, start)) for function, args in calls]
        try:
            return [p.get(timeout_s) for p in pending]
        except BaseException:
            for p in pending:  # the others' calls end too (an expected error: all raise it)
                p.wait(timeout_s)
            if not all(p.ready() for p in pending):
                self.close()  # a process is stuck in its call: the next race gets new ones
            raise

    def close(self) -> None:
        """Stop the processes. ``Pool.terminate`` can hang joining its own handler
        threads (seen on Python 3.11): then the workers are killed by PID instead."""
        pool, manager = self._pool, self._manager
        self._pool = self._manager = None
        if pool is not None:
            stopper = threading.Thread(target=lambda: (pool.terminate(), pool.join()), daemon=True)
            stopper.start()
            stopper.join(30)
            if stopper.is_alive():
                for process in list(pool._pool):
                    process.kill()
        if manager is not None:
            manager.shutdown()
