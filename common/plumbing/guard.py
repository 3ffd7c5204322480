"""The one guard every file the kit writes goes through (the runner's --json and --junit, the lessons'
--json, --csv, --plot and --trace-png): no file the kit did not write is ever replaced.

    problem = guard.refusal(path, "CSV")   # None, or one line ("x.py: exists and is not a CSV the
                                           # tutor wrote; left alone"), said before any work is done
    guard.write(path, text, "CSV")         # refusal() again, then temp file + rename, then noted

A file may be replaced when it is empty (nothing to lose: what `mktemp` makes), or when it is an earlier
one of the same kind the kit wrote: a results JSON or a JUnit report is known by its content; any kind
is known from the ledger of files the kit wrote ($TUTOR_STATE or .tutor/, written.json: path, kind,
size and SHA-256), so a file changed since the kit wrote it is no longer the kit's. A ledger that cannot
be written (a read-only checkout) only means such a file is not replaced later: the safe side.
"""
import fcntl
import hashlib
import json
import os
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS_KEYS = {"lesson", "np", "ranks"}   # what every results JSON holds (GUIDE §2)
JUNIT_HEAD = '<testsuite name="tutor-check"'
KEEP = 500                                 # ledger entries kept (the oldest go first)


class Refused(ValueError):
    """One line: the file is not written, nothing was replaced."""


def is_results_json(path):
    """True for a results JSON a lesson or the runner wrote (a JSON object with lesson, np, ranks)."""
    try:
        if os.path.getsize(path) > 64 << 20:
            return False
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and RESULTS_KEYS <= set(doc)


def is_junit(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(len(JUNIT_HEAD)) == JUNIT_HEAD
    except (OSError, ValueError):
        return False


KNOWN = {"results JSON": is_results_json, "JUnit report": is_junit}  # kinds told by their content


def refusal(path, kind):
    """Why `path` cannot take a new `kind` file without losing anything (one line), or None."""
    if not path or not str(path).strip():
        return "needs a file name"
    full = os.path.abspath(path)
    if os.path.isdir(full):
        return f"{path}: a folder; name a file in it"
    folder = os.path.dirname(full)
    if not os.path.isdir(folder):
        return f"{path}: no such folder {os.path.dirname(path) or folder} (the tutor makes none)"
    if os.path.lexists(full) and not ours(full, kind):
        return f"{path}: exists and is not a {kind} the tutor wrote; left alone"
    why = cannot_create(folder)
    return f"{path}: cannot write there ({why})" if why else None


def cannot_create(folder):
    """Why no new file can be made in `folder` (its strerror), or None. A file made and removed is the
    only sure test (permissions, read-only mounts, root or not)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".tutor-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def ours(full, kind):
    """True when the existing file `full` may be replaced by a new `kind` file."""
    if os.path.islink(full) or not os.path.isfile(full):
        return False
    if os.path.getsize(full) == 0 or KNOWN.get(kind, lambda p: False)(full):
        return True
    noted = _ledger().get(os.path.realpath(full))
    return (isinstance(noted, list) and noted[:2] == [kind, os.path.getsize(full)]
            and noted == [kind, *_fingerprint(full)])  # the size first: a big file is read only if it may match


def write(path, data, kind, flag=None):
    """refusal() again (the file may have appeared since the run was vetted), then write whole (temp
    file, rename) and note it in the ledger. data: text, bytes, or a function that writes a file
    given its name (matplotlib's savefig). Refused (one line, `flag` in front) or OSError."""
    problem = refusal(path, kind)
    if problem:
        raise Refused(f"{flag} {problem}" if flag else problem)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + "-", dir=folder)
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            if not callable(data):
                f.write(data)
        if callable(data):
            data(tmp)
        mask = os.umask(0o22)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # as open() would have made it (mkstemp's is 0600)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    note(path, kind)


def _state_dir():
    return os.environ.get("TUTOR_STATE") or os.path.join(ROOT, ".tutor")


def _fingerprint(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return [os.path.getsize(path), h.hexdigest()]


def _ledger():
    try:
        with open(os.path.join(_state_dir(), "written.json"), encoding="utf-8") as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def note(path, kind):
    """Add `path` to the ledger under a lock; a ledger that cannot be written is no error."""
    ledger = os.path.join(_state_dir(), "written.json")
    try:
        os.makedirs(_state_dir(), exist_ok=True)
        with open(ledger + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            doc = _ledger()
            doc.pop(os.path.realpath(path), None)
            doc[os.path.realpath(path)] = [kind, *_fingerprint(path)]
            doc = dict(list(doc.items())[-KEEP:])
            fd, tmp = tempfile.mkstemp(prefix=".written-", dir=_state_dir())
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(doc, f, indent=1)
                os.replace(tmp, ledger)
            except BaseException:  # a full disk: no half-written ledger left behind
                os.unlink(tmp)
                raise
    except OSError:
        pass
