"""Requests: the edge (intake, client), the batching core and the collector.

Importing this package imports nothing heavy: `dynamic_batching.core` is plain Python, and the
Celery-facing modules (`client`, `intake`, `collector`) are imported by name.
"""
