"""Watching Fenceline run: Prometheus metrics (metrics.py), health and readiness of the
control plane (health.py), one JSON log line per request and per job (logs.py)."""
