"""tel.weights.sent() / received(): a (name, tensor) stream, sync or async, handed back
measured. The sync runs from the first pull (the generator's first next(), when the
consumer starts to take weights: a receiver's clock then holds the first tensor's own
transfer, which starting at its arrival left out) to the stream's end; on the sending side
the fingerprints follow the last tensor as one more item (Sync.manifest: None otherwise),
on the receiving side that item is taken out (Sync.note_item says which it is). Items pass
through as they came (whatever their type); one that is not a (name, tensor) pair is left
uncounted. A stream abandoned part-way (a break, an error of the transport) still ends its
sync, and its error reaches the caller unchanged."""
from __future__ import annotations


def through(sync, stream):
    """`stream` measured as one side of `sync`: an async generator for an async iterable."""
    if hasattr(stream, "__aiter__"):
        return _through_async(sync, stream)
    return _through(sync, stream)


def _through(sync, stream):
    sync.begin()
    try:
        for item in stream:
            if not sync.note_item(item):
                yield item
        tail = sync.manifest()
        if tail is not None:
            yield tail
    finally:
        sync.end()


async def _through_async(sync, stream):
    sync.begin()
    try:
        async for item in stream:
            if not sync.note_item(item):
                yield item
        tail = sync.manifest()
        if tail is not None:
            yield tail
    finally:
        sync.end()
