"""The runner's own modules, used only by bin/tutor and the tests: finding lessons and reading their
YAML (catalog, schema, expect, expr), launching and watching a run (launch, lifetime, rundir), the verdict
(engine, verdict, checktable, files) and why a run hung (diagnose, flightwatch), practice copies (practice, exercise,
progress) and `doctor`.

Lessons never import from here: what a lesson uses lives one level up, in common/. The arrows point one
way: this package imports common's modules, never the reverse.
"""
