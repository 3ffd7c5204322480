"""Helpers shared by the lessons (bootstrap, report, watchdog) and by the runner (catalog, launch, expect)."""
