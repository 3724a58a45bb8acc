"""tel.exposed(loader): a loader whose next() (or __anext__) time is exposed time, the stall
a training loop pays for its data (Ray Train's "exposed data loading time")."""
from __future__ import annotations


def exposed_iterable(iterable, waiting):
    """Wrap a sync or async iterable; `waiting()` gives the context each fetch runs in."""
    if hasattr(iterable, "__aiter__"):
        return _AsyncExposed(iterable, waiting)
    if hasattr(iterable, "__iter__"):
        return _Exposed(iterable, waiting)
    raise TypeError(f"tel.exposed() needs an iterable or async iterable, got "
                    f"{type(iterable).__name__}")


class _Wrapped:
    def __init__(self, iterable, waiting):
        self._iterable = iterable
        self._waiting = waiting
        self._it = None


class _Exposed(_Wrapped):
    def __iter__(self):
        self._it = iter(self._iterable)
        return self

    def __next__(self):
        if self._it is None:
            self._it = iter(self._iterable)
        with self._waiting():
            return next(self._it)

    def __len__(self):
        return len(self._iterable)


class _AsyncExposed(_Wrapped):
    def __aiter__(self):
        self._it = self._iterable.__aiter__()
        return self

    async def __anext__(self):
        if self._it is None:
            self._it = self._iterable.__aiter__()
        with self._waiting():
            return await self._it.__anext__()
