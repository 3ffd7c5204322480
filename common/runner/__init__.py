"""The runner's own modules, used only by bin/tutor and the tests. The commands: cli (the typer app
bin/tutor hands over to), run_command (run), check_command (check), practice, doctor, testbed.
Finding lessons and reading their YAML (catalog, schema, yaml_checks, expr, exercise), launching and
watching a run (preflight, mpi_launchers, supervise, stop_signals, rank_processes), the verdict
(lesson_run, verdict, checktable), the files it writes (output_files), why a run hung (diagnose,
flightwatch), practice copies (practice_grading, progress).

Lessons never import from here: what a lesson uses lives one level up, in common/. The arrows point one
way: this package imports common's modules, never the reverse.
"""
import sys

from common.text import plain_marks

plain_marks(sys.stdout, sys.stderr)  # all the runner prints: '+' for '✓' where the terminal cannot print it
