"""Maintenance scripts of the repository (not installed): ``python -m tools.<name>``."""
