"""Running Fenceline itself: what the periodic jobs last did (jobs.py)."""
