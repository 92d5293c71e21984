"""Running Fenceline itself: what the periodic jobs last did (jobs.py), one sweep in several
processes (processes.py), the run totals job (totals.py)."""
