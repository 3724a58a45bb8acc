"""A data plane whose protocol methods are coroutine functions, over any synchronous one:
the async kind of a client, for tests that run one workload both ways."""
from __future__ import annotations


class AsyncPlane:
    def __init__(self, plane):
        self.plane = plane

    async def put_samples(self, *a, **k):
        return self.plane.put_samples(*a, **k)

    async def get_samples(self, *a, **k):
        return self.plane.get_samples(*a, **k)

    async def list_sample_ids(self, *a, **k):
        return self.plane.list_sample_ids(*a, **k)

    async def clear_samples(self, *a, **k):
        return self.plane.clear_samples(*a, **k)
