"""Pure functions from a metrics snapshot or a stored result to stats, Prometheus text and timelines."""
