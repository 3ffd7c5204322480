"""The lesson YAML's schema (README, "Lesson YAML"), checked when the YAML is loaded: every problem is
one SchemaError naming the file and the line of the key at fault.

Names in expressions are checked against what the run can bind: np, api, device, transport, and the
keys the lesson itself can report (its params and the fields of its rank items). Those keys are read
from the lesson's source and its own modules (lessons/<topic>/): every string key of a dict literal,
dict(key=...), x["key"] = ..., and every flag of its parser (a key built as f"has_{a}" stands for every
has_...); a name found nowhere there can never be bound, so it is refused now, not at run time.
"""
import ast
import difflib
import glob
import math
import os
import re

from common.runner import expr, yaml_checks
from common.text import path_shown

KEYS = {"title", "concept", "np", "apis", "devices", "timeout_s", "args", "expect", "hint", "view", "takeaway",
        "expects_death"}  # expects_death: a rank dies on purpose; the runner grades the survivors (lesson 18)
NP_KEYS = {"default", "min", "max", "check"}
CHECK_KEYS = {"name", "value", "rtol", "atol", "when", "none"} | set(yaml_checks.OPS)
ALWAYS = {"np", "api", "device", "transport", "rank"}   # `rank`: every ranks[*] item has it (GUIDE §2)
TAKEAWAY_COLUMNS = 96                                    # printed after "  - ": 100 columns
MAX_TIMEOUT_S = 86400                                    # one day: the watchdog's longest deadline
PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*|\[(\*|-?\d+)\])*$")


class SchemaError(ValueError):
    pass


def validate(data, root, path):
    """Raise SchemaError (file:line: what) at the first problem of `data` (root: its yaml node)."""
    where = _Where(path, root)
    if not isinstance(data, dict):
        where.fail(None, "expected a mapping of keys")
    for key in data:
        if key not in KEYS:
            close = difflib.get_close_matches(str(key), KEYS, 1)
            where.fail(key, f"unknown key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    for key in ("title", "np", "apis", "timeout_s", "expect"):
        if key not in data:
            where.fail(None, f"missing key {key!r}")
    for key in ("title", "concept"):
        if key in data and not (isinstance(data[key], str) and data[key].strip()):
            where.fail(key, f"{key} must be text")
    _np(data["np"], where.inside("np"))
    for key, allowed in (("apis", ("mpi4py", "torch")), ("devices", ("cpu", "gpu"))):
        values = data.get(key, [allowed[0]])
        if not (isinstance(values, list) and values and all(v in allowed for v in values)):
            where.fail(key, f"{key} must list {' and/or '.join(allowed)}")
    timeout = data["timeout_s"]
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
            not 0 < timeout <= MAX_TIMEOUT_S:  # nan fails this too: the watchdog cannot be switched off
        where.fail("timeout_s", f"timeout_s must be a number of seconds > 0 and <= {MAX_TIMEOUT_S}, "
                                f"got {timeout!r}")
    if not isinstance(data.get("args", []), list) or not all(
            isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in data.get("args", [])):
        where.fail("args", "args must be a list of flags and values, e.g. [\"--count\", \"1000\"]")
    hint = data.get("hint", "")
    if not (isinstance(hint, str) or isinstance(hint, list) and all(isinstance(h, str) for h in hint)):
        where.fail("hint", "hint must be text, or a list of texts")
    _view(data.get("view"), where)
    if not isinstance(data.get("expects_death", False), bool):
        where.fail("expects_death", "expects_death must be true or false")
    takeaway = data.get("takeaway", [])
    if not (isinstance(takeaway, list) and all(isinstance(t, str) and t.strip() for t in takeaway)):
        where.fail("takeaway", "takeaway must be a list of lines, e.g. [\"the ring sends 2(N-1)/N\"]")
    wide = [t for t in takeaway if len(t) > TAKEAWAY_COLUMNS]
    if wide:
        where.fail("takeaway", f"a takeaway line is {len(wide[0])} columns, over {TAKEAWAY_COLUMNS}: "
                               f"{wide[0][:40]!r}...")
    checks = data["expect"]
    if not isinstance(checks, list) or not checks:
        where.fail("expect", "expect must list at least one check")
    known = reported_names(path[:-5] + ".py")
    for i, check in enumerate(checks):
        _check(check, where.inside("expect", i), known)


def _np(np, where):
    if not isinstance(np, dict) or set(np) - NP_KEYS or not {"default", "min", "check"} <= set(np):
        where.fail(None, "np must be {default, min, max (optional), check: [...]}")
    for key in ("default", "min", "max"):
        if key in np and not _whole(np[key]):
            where.fail(key, f"np {key} must be a whole number >= 1, got {np[key]!r}")
    if not isinstance(np["check"], list) or not np["check"] or not all(_whole(n) for n in np["check"]):
        where.fail("check", "np check must list whole numbers >= 1")
    lo, hi = np["min"], np.get("max")
    if hi is not None and hi < lo:
        where.fail("max", f"np max {hi} is below its min {lo}")
    for key, values in (("default", [np["default"]]), ("check", np["check"])):
        off = [n for n in values if n < lo or hi is not None and n > hi]
        if off:
            span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            where.fail(key, f"np {key} {off[0]} is outside the lesson's range {span}")


def _view(view, where):
    """view: {args: [flags], says: text}: the lesson's own view that shows a failed check."""
    if view is None:
        return
    if not (isinstance(view, dict) and set(view) == {"args", "says"} and isinstance(view["says"], str)
            and view["says"].strip() and isinstance(view["args"], list) and view["args"]
            and all(isinstance(a, str) for a in view["args"])):
        where.fail("view", "view must be {args: [lesson flags], says: what that view shows}")


def _whole(n):
    return isinstance(n, int) and not isinstance(n, bool) and n >= 1


def _check(item, where, known):
    if not isinstance(item, dict):
        where.fail(None, f"a check takes only {sorted(CHECK_KEYS)}")
    for key in item:
        if key not in CHECK_KEYS:
            where.fail(key, f"a check takes only {sorted(CHECK_KEYS)}, not {key!r}")
    if "name" not in item or "value" not in item or sum(op in item for op in yaml_checks.OPS) != 1:
        where.fail(None, f"a check needs name, value and one of {list(yaml_checks.OPS)}")
    if not isinstance(item["name"], str) or not item["name"].strip():
        where.fail("name", "a check's name must be text")
    if not isinstance(item["value"], str) or not PATH.match(item["value"]):
        where.fail("value", f"value must be a path like ranks[*].max_abs_err, got {item['value']!r}")
    for key in ("rtol", "atol"):
        tol = item.get(key, 0)
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 <= tol < math.inf:
            where.fail(key, f"{key} must be a number >= 0, got {tol!r}")
    none = item.get("none", 0)  # the value that means "none" (a rank sent to no one: -1), shown as that word
    if isinstance(none, bool) or not isinstance(none, (int, float, str)):
        where.fail("none", f"none must be the one value that means none, e.g. -1, got {none!r}")
    for key in [*yaml_checks.OPS, "when"]:
        if isinstance(item.get(key), str):
            try:
                unknown = sorted(n for n in expr.names_used(item[key]) if not known.has(n))
            except expr.ExprError as exc:
                where.fail(key, str(exc))
            if unknown:
                close = difflib.get_close_matches(unknown[0], known.names, 1, 0.5)
                where.fail(key, f"unknown name {unknown[0]!r} in {item[key]!r}"
                                + (f": did you mean {close[0]!r}?" if close else "")
                                + " (known: np, api, device, transport, rank, what the lesson reports)")
        elif key == "when" and key in item and not isinstance(item[key], bool):
            where.fail(key, "when must be an expression, e.g. np >= 2")


class Known:
    """The names an expression may read: ALWAYS, plain keys, and patterns from f-string keys."""

    def __init__(self, names=(), patterns=()):
        self.names = set(ALWAYS) | {n for n in names if n.isidentifier()}
        self.patterns = [re.compile(p) for p in patterns]

    def has(self, name):
        return name in self.names or any(p.fullmatch(name) for p in self.patterns)


def lesson_sources(py_path):
    """The page and its own modules (lessons/<topic>/*.py, the folder named for NN_topic.py)."""
    folder = os.path.join(os.path.dirname(py_path), os.path.basename(py_path)[:-3].split("_", 1)[-1])
    own = sorted(glob.glob(os.path.join(folder, "*.py"))) if os.path.isdir(folder) else []
    return [py_path] + own


_READ = {}  # {(path, mtime_ns, size) of each source: Known}: a lesson's sources parsed once a process


def reported_names(py_path):
    """Known names from the lesson's source, its own modules' too (a results row may be built there):
    string keys and keyword names of dicts, keys it assigns, its flags' dests. Only ALWAYS when there
    is no page to read. Read again only when a source changed (a test resolves a lesson per case)."""
    stamp = []
    for path in lesson_sources(py_path):
        try:
            st = os.stat(path)
            stamp.append((path, st.st_mtime_ns, st.st_size))
        except OSError:
            stamp.append((path, None, None))
    stamp = tuple(stamp)
    if stamp not in _READ:
        _READ[stamp] = _read_names(py_path)
    return _READ[stamp]


def _read_names(py_path):
    trees = []
    for path in lesson_sources(py_path):
        try:
            with open(path, encoding="utf-8") as f:
                trees.append(ast.parse(f.read(), path))
        except (OSError, SyntaxError, ValueError):
            if path == py_path:
                return Known()
    keys, found = [], set()
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, ast.Dict):
            keys += node.keys
        elif isinstance(node, ast.DictComp):
            keys.append(node.key)
        elif isinstance(node, ast.Call):
            found |= {k.arg for k in node.keywords if k.arg}
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
                    found.add(arg.value[2:].replace("-", "_"))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            keys.append(node.slice)
    found |= {k.value for k in keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    patterns = ["".join(re.escape(p.value) if isinstance(p, ast.Constant) else r"\w+" for p in k.values)
                for k in keys if isinstance(k, ast.JoinedStr)]
    return Known(found, patterns)


class _Where:
    """Where a key sits in the YAML: the line of its own node, else of the nearest enclosing one."""

    def __init__(self, path, node):
        self.path, self.node = path, node

    def _child(self, key):
        node = self.node
        if node is not None and node.id == "mapping":
            for k, v in node.value:
                if k.value == key:
                    return k
        return None

    def inside(self, key, index=None):
        node = self._child(key)
        if node is not None:
            node = next(v for k, v in self.node.value if k is node)
            if index is not None:
                node = node.value[index] if node.id == "sequence" and index < len(node.value) else node
        return _Where(self.path, node if node is not None else self.node)

    def fail(self, key, message):
        node = (self._child(key) if key is not None else None) or self.node
        line = node.start_mark.line + 1 if node is not None else 1
        raise SchemaError(f"{path_shown(self.path)}:{line}: {message}")
