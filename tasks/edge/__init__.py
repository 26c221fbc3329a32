"""Accepting a request: validation, token counting, queuing (submit / submit_many)."""
