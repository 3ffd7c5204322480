"""Every file the runner writes, and the rules it keeps (README, "Troubleshooting"):

  run --json PATH, check --junit PATH,  checked before anything is launched (common/plumbing/guard.py, the one
  a lesson's --csv, --plot, --trace-png guard the lessons' writers use too): the folder must exist and
                                        take a file; PATH must not be a folder, and an existing file is
                                        replaced only if empty or an earlier one of the same kind the
                                        tutor wrote. Written whole or not at all (temp file, rename).
  .tutor/progress.json                  read-modify-write under a lock; a damaged file is kept aside.
  practice/NN_name.py                   the new copy is written first, then the one it replaces is kept
                                        under the first free .bak name (a full disk changes nothing).
"""
import errno
import fcntl
import os
import tempfile
from contextlib import contextmanager

from common import plot
from common.plumbing import guard
from common.plumbing.guard import JUNIT_HEAD
from common.runner.exercise import PracticeError
from common.text import path_shown

KINDS = {"--json": "results JSON", "--junit": "JUnit report"}
OUTPUTS = {"--csv": "CSV", "--plot": "PNG", "--trace-png": "PNG"}   # the lessons' own output flags


class FileError(ValueError):
    """One line for the learner, said before anything runs."""


def check_target(path, flag, kind=None, ours=None):
    """Raise FileError (one line) unless `path` can take a new `kind` file without losing anything
    (common/plumbing/guard.py's rule: empty, or the kit's own earlier output of that kind)."""
    kind = kind or KINDS.get(flag) or OUTPUTS[flag]
    problem = plot.cannot_write(path) if kind == "PNG" else guard.refusal(path, kind)
    if problem:
        if problem.endswith("name a file in it"):
            problem += f", e.g. {os.path.join(path, 'results.json' if flag == '--json' else 'junit.xml')}"
        raise FileError(f"{flag} {problem}")


def write_new(path, text, flag, kind=None, ours=None):
    """check_target again (the file may have appeared since), then write whole: temp file, rename."""
    try:
        guard.write(path, text, kind or KINDS[flag], flag)
    except guard.Refused as exc:
        raise FileError(str(exc)) from None


def lesson_outputs(extra, here=None):
    """The lesson flags after `--` with every output path (--csv, --plot, --trace-png) made absolute
    against `here` (the folder the learner typed it in: the ranks run in the project root), each vetted
    by check_target. Exact names only: a prefix may be another flag of the lesson's (05's --trace); an
    abbreviation argparse takes is refused by the lesson's own writer (common/plumbing/guard.py). FileError."""
    out, args, i = [], [str(a) for a in extra], 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name in OUTPUTS:
            if not eq and i + 1 < len(args):
                i, value = i + 1, args[i + 1]
            check_target(os.path.join(here, value) if here else value, name)  # as typed, in the message
            value = os.path.join(here or os.getcwd(), value)
            out += [f"{name}={value}"] if eq else [name, value]
        else:
            out.append(args[i])
        i += 1
    return out


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


def replace_keeping(path, text, keep):
    """Write `text` to `path` whole; with `keep`, the file there is first kept aside (keep_aside,
    '.bak'). The new text is written beside it before anything moves, so a full disk fails there and
    changes nothing; a rename needs no space. Returns the kept name or None; FileError (one line)."""
    folder, staged, backup = os.path.dirname(os.path.abspath(path)), None, None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, staged = tempfile.mkstemp(prefix="." + os.path.basename(path) + "-", dir=folder)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(staged, 0o644)
        if keep:
            backup = keep_aside(path, ".bak")
        os.replace(staged, path)
    except (OSError, FileError) as exc:
        if staged and os.path.exists(staged):
            os.unlink(staged)
        if backup and not os.path.exists(path):
            os.rename(backup, path)
        raise FileError(f"{path_shown(path)}: could not write the new copy "
                        f"({getattr(exc, 'strerror', None) or exc}); nothing was changed") from None
    return backup


class Full(PracticeError):
    """A folder the learner's files go in has no room left: one line, before anything is written."""


def writable(folder):
    """True when `folder` (or, not made yet, the nearest folder above it) takes a new file with
    something in it; False for a path through a file or a folder that takes none. A full disk is
    Full (one line with the reason): an empty probe file needs no room, so the probe writes a byte."""
    while not os.path.lexists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        return False
    probe = None
    try:
        fd, probe = tempfile.mkstemp(prefix=".tutor-probe-", dir=folder)
        try:
            os.write(fd, b"\n")
            os.fsync(fd)  # a file system that allocates late says it here
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise Full(f"{path_shown(folder)}: {exc.strerror}; nothing was changed: free some space there, "
                       "or use another folder") from None
        return False
    finally:
        if probe and os.path.lexists(probe):
            os.unlink(probe)
    return True


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
            said = first if first.startswith(status) else f"{status}: {first}"
            parts.append(f"    <skipped message={quoteattr(said)}/>")
        elif status != "pass":
            tail = outcome.tail[-40:] if outcome else []
            parts.append(f'    <failure type="{status}" message={quoteattr(first)}>'
                         f'{escape(chr(10).join(why + tail))}</failure>')
        parts.append("  </testcase>")
    parts.append("</testsuite>\n")
    write_new(path, "\n".join(parts), "--junit")
