"""Every file the runner writes, and the rules it keeps (README, "Troubleshooting"):

  run --json PATH, check --junit PATH   checked before anything is launched: the folder must exist and
                                        take a file; PATH must not be a folder, and an existing file is
                                        replaced only if it is an earlier one of the same kind the tutor
                                        wrote. Written whole or not at all (temp file, then rename).
  .tutor/progress.json                  read-modify-write under a lock; a damaged file is kept aside.
  practice/NN_name.py                   a copy being replaced is kept under the first free .bak name.
"""
import fcntl
import json
import os
import tempfile
from contextlib import contextmanager

from common import report

RESULTS_KEYS = {"lesson", "np", "ranks"}   # what every results JSON holds (GUIDE §2)
JUNIT_HEAD = '<testsuite name="tutor-check"'


class FileError(ValueError):
    """One line for the learner, said before anything runs."""


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


def check_target(path, flag, kind, ours):
    """Raise FileError (one line) unless `path` can take a new `kind` file without losing anything."""
    if not path or not path.strip():
        raise FileError(f"{flag} needs a file name")
    full = os.path.abspath(path)
    if os.path.isdir(full):
        raise FileError(f"{flag} {path}: a folder; name a file, e.g. "
                        f"{os.path.join(path, 'results.json' if flag == '--json' else 'junit.xml')}")
    folder = os.path.dirname(full)
    if not os.path.isdir(folder):
        raise FileError(f"{flag} {path}: no folder {os.path.dirname(path) or folder} (the tutor makes none)")
    if os.path.lexists(full) and (os.path.islink(full) or not os.path.isfile(full) or not ours(full)):
        raise FileError(f"{flag} {path}: exists and is not a {kind} the tutor wrote; left alone")
    try:  # the only sure test of "can I write there" (permissions, read-only mounts, root or not)
        fd, probe = tempfile.mkstemp(prefix=".tutor-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise FileError(f"{flag} {path}: cannot write there ({exc.strerror})") from None


def write_new(path, text, flag, kind, ours):
    """check_target again (the file may have appeared since), then write whole: temp file, rename."""
    check_target(path, flag, kind, ours)
    report.atomic_write(path, text)


def keep_aside(path, suffix):
    """Move `path` to the first free name of path+suffix, path+suffix+'2', ...; return that name.
    os.link claims a name atomically, so two tutors at once never pick the same one."""
    for n in range(1, 10000):
        aside = f"{path}{suffix}{n if n > 1 else ''}"
        try:
            os.link(path, aside)
        except FileExistsError:
            continue
        os.unlink(path)
        return aside
    raise FileError(f"{path}: too many earlier copies beside it ({suffix}...); tidy them up first")


@contextmanager
def locked(path):
    """Hold an exclusive lock tied to `path` (in path + '.lock') for a read-modify-write."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file releases the lock, even on an exception


def write_junit(path, cases):
    """A JUnit XML file for CI dashboards: one testcase per (lesson, np, api, outcome, status, why).
    A case that could not run here (`blocked`) or was not started (`not run`) is <skipped> with the
    reason, never a silent pass; every other status but `pass` is a <failure>."""
    from xml.sax.saxutils import escape, quoteattr
    skipped = sum(c[4] in ("blocked", "not run") for c in cases)
    failed = sum(c[4] != "pass" for c in cases) - skipped
    parts = [f'{JUNIT_HEAD} tests="{len(cases)}" failures="{failed}" skipped="{skipped}">']
    for lesson, n, api, outcome, status, why in cases:
        seconds = outcome.seconds if outcome else 0.0
        parts.append(f'  <testcase classname={quoteattr(lesson.name)} name="np{n}-{api}" time="{seconds:.2f}">')
        first = why[0] if why else status
        if status in ("blocked", "not run"):
            parts.append(f"    <skipped message={quoteattr(first if first.startswith(status) else f'{status}: {first}')}/>")
        elif status != "pass":
            tail = outcome.tail[-40:] if outcome else []
            parts.append(f'    <failure type="{status}" message={quoteattr(first)}>'
                         f'{escape(chr(10).join(why + tail))}</failure>')
        parts.append("  </testcase>")
    parts.append("</testsuite>\n")
    write_new(path, "\n".join(parts), "--junit", "JUnit report", is_junit)
