"""Clients of real data planes: transferqueue, mooncake."""
