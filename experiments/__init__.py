"""Sweeps over train.py runs and the reports that compare them (scripts/sweep.py, scripts/report.py)."""
