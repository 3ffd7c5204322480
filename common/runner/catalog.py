"""The lessons and their YAML: finding one by id, and reading its metadata with a schema check.

YAML schema (every key documented in README.md, "Lesson YAML"):
  title, concept       text
  np                   {default, min, max (optional), check: [NP, ...]}
  apis                 [mpi4py, torch]    devices: [cpu, gpu] (optional; gpu alone = needs a GPU)
  timeout_s            seconds the runner gives one run before the watchdog ends it
  args                 extra lesson flags the runner passes in `check` (optional)
  expect               [{name, value, equals|le|ge|lt|gt, rtol, atol, when}]
  hint                 text, or a list of hints given one at a time
  view                 {args: [lesson flags], says: text}: the lesson's own view that shows a failed
                       check (05: --trace); `run` and `check` print its command after a failure
  takeaway             2-3 lines of what to take away, printed after a passing `bin/tutor run`
"""
import difflib
import os
import re
from dataclasses import dataclass

import yaml

from common.runner import schema
from common.text import path_shown

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def lessons_dir():
    """lessons/, or $TUTOR_LESSONS (the tests point it at tests/fixtures)."""
    return os.environ.get("TUTOR_LESSONS") or os.path.join(ROOT, "lessons")


NAME = re.compile(r"^(\d\d)_([a-z0-9_]+)\.py$")


class CatalogError(ValueError):
    pass


@dataclass
class Lesson:
    id: str        # "05"
    name: str      # "05_ring_allreduce"
    path: str      # lessons/05_ring_allreduce.py
    meta: dict

    @property
    def yaml_path(self):
        return self.path[:-3] + ".yaml"

    @property
    def np_range(self):
        np = self.meta["np"]
        return np["min"], np.get("max")

    @property
    def needs_gpu(self):
        return self.meta.get("devices", ["cpu", "gpu"]) == ["gpu"]


LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, ten times faster where built


def load_yaml(path):
    """The lesson's metadata, validated (common/runner/schema.py); CatalogError names the file and line."""
    try:
        with open(path) as f:
            text = f.read()
        root = yaml.compose(text, Loader=LOADER)
        data = yaml.load(text, Loader=LOADER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise CatalogError(f"{path_shown(path)}{line}: malformed YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path_shown(path)}: malformed YAML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        schema.validate(data, root, path)
    except schema.SchemaError as exc:
        raise CatalogError(str(exc)) from None
    return data


def lessons(folder=None):
    folder = folder or lessons_dir()
    found = []
    for fname in sorted(os.listdir(folder)):
        m = NAME.match(fname)
        if m:
            path = os.path.join(folder, fname)
            found.append(Lesson(m.group(1), fname[:-3], path, None))
    return found


def resolve(text, folder=None):
    """The lesson named by `5`, `05`, `05_ring_allreduce` or `ring_allreduce`; metadata loaded."""
    all_lessons = lessons(folder)
    key = str(text).strip().removesuffix(".py")
    for lesson in all_lessons:
        topic = lesson.name[3:]
        if key in (lesson.id, lesson.name, topic) or (key.isdigit() and int(key) == int(lesson.id)):
            lesson.meta = load_yaml(lesson.yaml_path)
            return lesson
    names = [l.name for l in all_lessons] + [l.name[3:] for l in all_lessons]
    close = difflib.get_close_matches(key, names, 3, 0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; `bin/tutor list` shows them all"
    raise CatalogError(f"no lesson {text!r}{hint}")


def takeaway_lines(lesson):
    """What to take away from the lesson (its YAML's `takeaway`), as `bin/tutor run` says it after a pass."""
    said = lesson.meta.get("takeaway") or []
    return ["take away:"] + [f"  - {line}" for line in said] if said else []


def view_command(lesson, np, api, device, mine=False):
    """(the command that shows a run in the lesson's own view (YAML `view`), what that view shows), or
    (the plain command, None) for a lesson without one: the run's whole output, which `check` hides."""
    view = lesson.meta.get("view")
    words = ["bin/tutor", "run", lesson.id] + (["--mine"] if mine else []) + ["-n", str(np)]
    words += (["--api", api] if api != "mpi4py" else []) + (["--device", device] if device == "gpu" else [])
    if view:
        return " ".join(words + ["--", *view["args"]]), view["says"]
    return " ".join(words), None
