"""Data planes dpobs ships: the in-memory reference store and its cross-process server."""
