"""Shared fixtures: a real redis-server (see ``redis_server.py``)."""

from redis_server import redis_server

__all__ = ["redis_server"]
