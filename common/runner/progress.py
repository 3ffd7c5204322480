"""The learner's progress: one small file, .tutor/progress.json (git-ignored), changed only under a
lock and written atomically (temp + rename), so two commands at once both count; a damaged file is
kept aside (progress.json.damaged) with a warning, never silently lost:
    {"05_ring_allreduce": {"state": "in progress" | "passed", "hints": 2}}
"""
import json
import os
import sys

from common.runner import files
from common.runner.catalog import ROOT
from common.runner.terminal import path_shown
from common.report import atomic_write


def progress_path():
    """.tutor/progress.json; another lessons folder ($TUTOR_LESSONS, the tests') keeps its own file."""
    other = os.environ.get("TUTOR_LESSONS")
    name = f"progress-{os.path.basename(os.path.normpath(other))}.json" if other else "progress.json"
    return os.path.join(os.environ.get("TUTOR_STATE") or os.path.join(ROOT, ".tutor"), name)


def load_progress():
    """Everyone's progress; a damaged file is moved aside (with a warning) and reads as a fresh start."""
    try:
        with files.locked(progress_path()):
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
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc).split(":")[0]
    try:
        aside = path_shown(files.keep_aside(path, ".damaged")) if keep_aside else None
    except (OSError, files.FileError):
        aside = None
    print(f"tutor: warning: {path_shown(path)} is damaged ({why}); "
          + (f"kept it as {aside} and started afresh" if aside else "starting afresh"), file=sys.stderr)
    return {}


def change(lesson, how):
    """Apply how(entry) to this lesson's progress entry, atomically under the lock; return the entry."""
    with files.locked(progress_path()):
        data = _read_progress()
        entry = data.setdefault(lesson.name, {})
        how(entry)
        atomic_write(progress_path(), json.dumps(data, indent=1, sort_keys=True) + "\n")
        return entry


def update(lesson, **fields):
    return change(lesson, lambda entry: entry.update(fields))
