"""tel.weights.sent() / received(): a (name, tensor) stream, sync or async, handed back
measured. The sync runs from the first item pulled to the stream's end; the sender's
fingerprints follow its last tensor as one more item; the receiver takes that item out.
Items pass through as they came (whatever their type); one
that is not a (name, tensor) pair is left uncounted. A stream abandoned part-way (a break, an error of the transport) still ends its sync, and
its error reaches the caller unchanged."""
from __future__ import annotations

def sent(sync, stream):
    if hasattr(stream, "__aiter__"):
        return _sent_async(sync, stream)
    return _sent(sync, stream)


def received(sync, stream):
    if hasattr(stream, "__aiter__"):
        return _received_async(sync, stream)
    return _received(sync, stream)


def _sent(sync, stream):
    try:
        for item in stream:
            sync.note_item(item)
            yield item
        item = sync.manifest()
        if item is not None:
            yield item
    finally:
        sync.end()


async def _sent_async(sync, stream):
    try:
        async for item in stream:
            sync.note_item(item)
            yield item
        item = sync.manifest()
        if item is not None:
            yield item
    finally:
        sync.end()


def _received(sync, stream):
    try:
        for item in stream:
            if not sync.note_item(item):
                yield item
    finally:
        sync.end()


async def _received_async(sync, stream):
    try:
        async for item in stream:
            if not sync.note_item(item):
                yield item
    finally:
        sync.end()
