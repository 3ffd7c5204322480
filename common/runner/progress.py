"""The learner's progress: one small file, .tutor/progress.json (git-ignored), changed only under a
lock and written atomically (temp + rename), so two commands at once both count; a damaged file is
kept aside (progress.json.damaged) with a warning, never silently lost:
    {"05_ring_allreduce": {"state": "in progress" | "passed", "hints": 2,
                           "run": "pass",       # how the last `bin/tutor run 05` ended (for `list`)
                           "failed": {"where": "np=3 api=mpi4py", "what": [check names]},  # for `hint`
                           "hints_for": {...}}} # the failure the hint count belongs to
"""
import json
import os
import sys

from common.report import atomic_write
from common.runner import output_files
from common.runner.catalog import ROOT
from common.runner.exercise import PracticeError
from common.text import fit, path_shown


def progress_path():
    """.tutor/progress.json; another lessons folder ($TUTOR_LESSONS, the tests') keeps its own file."""
    other = os.environ.get("TUTOR_LESSONS")
    name = f"progress-{os.path.basename(os.path.normpath(other))}.json" if other else "progress.json"
    return os.path.join(os.environ.get("TUTOR_STATE") or os.path.join(ROOT, ".tutor"), name)


def load_progress():
    """Everyone's progress; a damaged file is moved aside (with a warning) and reads as a fresh start."""
    try:
        with output_files.locked(progress_path()):
            return _read_progress()
    except OSError:  # no lock to be had (a read-only install): read what is there, change nothing
        return _read_progress(keep_aside=False)


def _read_progress(keep_aside=True):
    path = progress_path()
    try:
        with open(path) as f:
            data = json.load(f)
        if isinstance(data, dict) and all(isinstance(v, dict) for v in data.values()):
            return data
        why = "not a table of lessons"
    except (FileNotFoundError, NotADirectoryError):  # no file, or TUTOR_STATE names a file: nothing yet
        return {}
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or ("not JSON" if isinstance(exc, ValueError) else str(exc))
    try:
        aside = output_files.keep_aside(path, ".damaged") if keep_aside else None
    except (OSError, output_files.FileError):
        aside = None
    print(fit(f"tutor: warning: {path_shown(path)} is damaged ({why}): "
              + (f"kept as {os.path.basename(aside)} beside it; starting afresh" if aside else "starting afresh")),
          file=sys.stderr)
    return {}


class Unsaved(PracticeError, OSError):
    """The progress file could not be written (a full disk, TUTOR_STATE naming a file): one line for
    the learner (a PracticeError), and an OSError with its strerror for those who catch that."""

    def __init__(self, exc):
        self.strerror = exc.strerror or str(exc)
        super().__init__(f"{path_shown(os.path.dirname(progress_path()))}: could not save your progress "
                         f"({self.strerror}): free some space, or set TUTOR_STATE to a folder of yours")


def change(lesson, how):
    """Apply how(entry) to this lesson's progress entry, atomically under the lock; return the entry.
    Unsaved (one line) when it cannot be written; the file is then as it was."""
    try:
        with output_files.locked(progress_path()):
            data = _read_progress()
            entry = data.setdefault(lesson.name, {})
            how(entry)
            atomic_write(progress_path(), json.dumps(data, indent=1, sort_keys=True) + "\n")
            return entry
    except OSError as exc:
        if isinstance(exc, Unsaved):
            raise
        raise Unsaved(exc) from None


def update(lesson, **fields):
    return change(lesson, lambda entry: entry.update(fields))
