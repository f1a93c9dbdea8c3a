"""Fault injection (issue 11, SPEC S7, S4, U6, D1, D4, W5, W6): a private redis-server made
slow, stopped, flushed, or put behind a proxy that delays and loses replies, with real Celery
workers. See tests/faults/servers.py, proxy.py and store.py for the reusable pieces."""
