"""The lessons and their YAML: finding one by id, and reading its metadata with a schema check.

YAML schema (every key documented in README.md, "Lesson YAML"):
  title, concept       text
  np                   {default, min, max (optional), check: [NP, ...]}
  apis                 [mpi4py, torch]    devices: [cpu, gpu] (optional; gpu alone = needs a GPU)
  timeout_s            seconds the runner gives one run before the watchdog ends it
  args                 extra lesson flags the runner passes in `check` (optional)
  expect               [{name, value, equals|le|ge|lt|gt, rtol, atol, when}]
  hint                 text, or a list of hints given one at a time
"""
import difflib
import os
import re
from dataclasses import dataclass

import yaml

from common import expect, expr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lessons_dir():
    """lessons/, or $TUTOR_LESSONS (the tests point it at tests/fixtures)."""
    return os.environ.get("TUTOR_LESSONS") or os.path.join(ROOT, "lessons")


KEYS = {"title", "concept", "np", "apis", "devices", "timeout_s", "args", "expect", "hint"}
NP_KEYS = {"default", "min", "max", "check"}
CHECK_KEYS = {"name", "value", "rtol", "atol", "when"} | set(expect.OPS)
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


def _where(path, node):
    return f"{os.path.relpath(path)}:{node.start_mark.line + 1}"


def load_yaml(path):
    """The lesson's metadata, validated; CatalogError names the file and line of the problem."""
    try:
        with open(path) as f:
            text = f.read()
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise CatalogError(f"{os.path.relpath(path)}{line}: malformed YAML: {exc.problem}") from None
    except OSError as exc:
        raise CatalogError(f"{path}: {exc.strerror}") from None
    if not isinstance(data, dict):
        raise CatalogError(f"{os.path.relpath(path)}:1: expected a mapping of keys")
    lines = {k.value: v for k, v in root.value}

    def bad(key, message):
        raise CatalogError(f"{_where(path, lines.get(key, root))}: {message}")
    for key in data:
        if key not in KEYS:
            close = difflib.get_close_matches(str(key), KEYS, 1)
            bad(key, f"unknown key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    for key in ("title", "np", "apis", "timeout_s", "expect"):
        if key not in data:
            bad(None, f"missing key {key!r}")
    np = data["np"]
    if not isinstance(np, dict) or set(np) - NP_KEYS or not {"default", "min", "check"} <= set(np):
        bad("np", "np must be {default, min, max (optional), check: [...]}")
    if not all(isinstance(v, int) and v >= 1 for v in [np["default"], np["min"], *np["check"]]):
        bad("np", "np values must be whole numbers >= 1")
    if not set(data["apis"]) <= {"mpi4py", "torch"} or not data["apis"]:
        bad("apis", "apis must list mpi4py and/or torch")
    for item, node in zip(data["expect"] or [], lines["expect"].value):
        where = f"{_where(path, node)}"
        if not isinstance(item, dict) or set(item) - CHECK_KEYS:
            raise CatalogError(f"{where}: a check takes only {sorted(CHECK_KEYS)}")
        if "name" not in item or "value" not in item or sum(op in item for op in expect.OPS) != 1:
            raise CatalogError(f"{where}: a check needs name, value and one of {list(expect.OPS)}")
        for key in list(expect.OPS) + ["when"]:
            if isinstance(item.get(key), str):
                try:  # parse now, with every name bound to 1, so a bad expression fails on load
                    expr.evaluate(item[key], _AnyName())
                except expr.ExprError as exc:
                    raise CatalogError(f"{where}: {exc}") from None
                except (ArithmeticError, TypeError, ValueError):
                    pass
    return data


class _AnyName(dict):
    def __contains__(self, key):
        return True

    def __getitem__(self, key):
        return 1


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
