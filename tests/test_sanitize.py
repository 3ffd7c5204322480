"""--sanitize (common/sanitize.py): the checks on one process (no MPI), then the hazards planted in
tests/fixtures/sanitize_planted.py, each named by its line in every one of 10 seeded runs at NP 2, a
strict run that fails, and a correct lesson that passes with --sanitize and --debug-collectives."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from common import sanitize
from common.plumbing import run_folder
from common.runner import catalog, lesson_run
from conftest import FIXTURES, ROOT, tutor

PLANTED = os.path.join(FIXTURES, "sanitize_planted.py")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
RUNS = 10


def above():
    """'test_sanitize.py:LINE' of the line above the caller's."""
    return f"test_sanitize.py:{sys._getframe(1).f_lineno - 1}"


def quiet():
    return sanitize.Sanitizer(strict=False, quiet=True)


# ---------------------------------------------------------------- one process, fake transport
def test_a_send_buffer_written_before_its_wait_names_both_lines():
    san, buf, posted = quiet(), np.ones(8), []
    p = san.send(buf, posted.append)
    post = above()
    buf[3] = 2.0
    assert posted == []                      # nothing taken yet: the data leaves at the next call
    san.flush()                              # the stream starts it
    assert posted[0] is buf and posted[0][3] == 2.0
    san.complete(p)
    wait = above()
    assert san.reports == [f"send buffer written before its wait: posted at {post}, waited at {wait}"]


def test_strict_raises_at_the_wait_and_an_untouched_send_says_nothing():
    san, buf = sanitize.Sanitizer(strict=True, quiet=True), np.arange(5, dtype=np.int32)
    p = san.send(buf, lambda b: None)
    san.flush()
    san.complete(p)
    assert san.reports == []
    p = san.send(buf, lambda b: None)
    buf += 1
    with pytest.raises(sanitize.SanitizeError, match="send buffer written before its wait"):
        san.complete(p)


@pytest.mark.parametrize("dtype, poison", [(np.float32, "nan"), (np.float64, "nan"), (np.int64, 0xA5A5A5A5A5A5A5A5),
                                           (np.uint8, 0xA5)])
def test_a_posted_receive_holds_poison_until_its_wait_delivers(dtype, poison):
    san, buf, staged = quiet(), np.zeros(6, dtype), []
    p = san.recv(buf, staged.append, lambda b: np.empty_like(b))
    if poison == "nan":
        assert np.isnan(buf).all()
    else:
        assert (buf.view(np.uint8) == 0xA5).all() and int(buf.view(np.uint64 if buf.itemsize == 8 else
                                                                    np.uint8)[0]) == poison
    san.flush()                               # the stream posts the receive
    staged[0][:] = 7                          # the transfer lands in the sanitizer's own buffer
    assert not (buf == 7).any()
    san.complete(p)
    assert (buf == 7).all() and san.reports == []


def test_a_receive_buffer_written_before_its_wait_is_named():
    san, buf = quiet(), np.zeros(4)
    p = san.recv(buf, lambda b: None, np.empty_like)
    post = above()
    buf[0] = 1.0
    san.complete(p)
    wait = above()
    assert san.reports == [f"recv buffer written before its wait: posted at {post}, waited at {wait}"]


@pytest.mark.skipif(sys.gettrace() is not None, reason="another tracer (a debugger, coverage) runs here")
def test_a_read_before_the_wait_names_its_line_and_a_read_after_it_is_fine():
    san, buf = quiet(), np.zeros(16)
    with sanitize.using(san):
        p = san.recv(buf, lambda b: None, np.empty_like)
        post = above()
        other = buf[:4]   # a view inside the posted buffer: a read
        read = above()
        san.complete(p)
        after = buf[:4]
    assert other.shape == after.shape == (4,) and sys.gettrace() is None  # the tracer is off again
    assert san.reports == [f"receive buffer read before its wait: posted at {post}, read at {read} (buf)"]


@pytest.mark.skipif(sys.gettrace() is not None, reason="another tracer (a debugger, coverage) runs here")
def test_a_read_of_the_posted_part_of_a_larger_array_is_named_and_other_parts_are_free():
    san, u, halo = quiet(), np.zeros(20), 4
    with sanitize.using(san):
        p = san.recv(u[:halo], lambda b: None, np.empty_like)
        post = above()
        q = san.send(u[halo:2 * halo], lambda b: None)   # another part of u, handed to a send: no read
        interior = u[halo:].sum()                        # no read
        edge = u[halo - 1:halo + 1].sum()                # one posted item among them: a read
        read = above()
        san.flush()
        san.complete(q)
        san.complete(p)
    assert interior == 0 and np.isnan(edge)
    assert san.reports == [f"receive buffer read before its wait: posted at {post}, read at {read} (u[...])"]


def test_a_buffer_both_sent_and_received_and_a_request_never_waited_are_named():
    san, buf = quiet(), np.zeros(10)
    san.recv(buf[2:6], lambda b: None, np.empty_like)
    recv = above()
    s = san.send(buf[:1], lambda b: None)     # no overlap with [2:6]: fine
    san.send(buf[4:], lambda b: None)
    send = above()
    san.flush()
    san.complete(s)
    lines = san.close()
    assert lines[0] == (f"one buffer is a send's and a receive's: recv posted at {recv}, send posted at "
                        f"{send}, neither waited")
    assert sorted(line.split(":")[0] for line in lines[1:]) == ["recv request never waited",
                                                                "send request never waited"]


# ---------------------------------------------------------------- real runs at NP 2
def marks():
    """{(kind, hazard): 'sanitize_planted.py:LINE'} from the fixture's `# planted: x` comments."""
    out = {}
    with open(PLANTED) as f:
        for i, line in enumerate(f, 1):
            for kind, name in re.findall(r"# (planted|posted|waited): (\w+)", line):
                out.setdefault((kind, name), []).append(f"sanitize_planted.py:{i}")
    return out


def expected(api, rank=0):
    """{hazard: the report rank `rank` must make every run}."""
    m, i = marks(), 0 if api == "mpi4py" else 1
    cycle = " -> ".join(map(str, [rank, 1 - rank, rank]))
    return {
        "write": f"send buffer written before its wait: posted at {m['posted', 'write'][i]}, "
                 f"waited at {m['waited', 'write'][i]}",
        "read": f"receive buffer read before its wait: posted at {m['posted', 'read'][i]}, "
                f"read at {m['planted', 'read'][i]} (got)",
        "reuse": f"send buffer written before its wait: posted at {m['posted', 'reuse'][i]}, "
                 f"waited at {m['waited', 'reuse'][i]}" if rank == 0 else None,  # rank 1 receives first
        "never": f"send request never waited: posted at {m['planted', 'never'][i]}",
        "alias": f"one buffer is a send's and a receive's: recv posted at {m['posted', 'alias'][i]}, "
                 f"send posted at {m['planted', 'alias'][i]}, neither waited",
        "headtohead": f"ungrouped point-to-point calls deadlock in NCCL's order: send posted at "
                      f"{m['posted', 'headtohead'][i]}, waited at {m['waited', 'headtohead'][i]} (ranks {cycle})"}


def run(args, tmp_path, timeout=120, env=None):
    from common.runner import mpi_launchers  # what the launcher needs here (Open MPI as root: its flags)
    extra = mpi_launchers.additions(mpi_launchers.identify(MPIEXEC), [MPIEXEC], 2)
    return subprocess.run([MPIEXEC, *extra, "-n", "2", sys.executable, "-m", "mpi4py", *args], cwd=ROOT,
                          timeout=timeout, capture_output=True, text=True, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("api", ["mpi4py", pytest.param("torch", marks=pytest.mark.torch)])
def test_every_planted_hazard_is_named_by_its_line_in_every_seeded_run(api, tmp_path):
    out = tmp_path / "runs.json"
    proc = run([PLANTED, "--api", api, "--runs", str(RUNS), "--json", str(out)], tmp_path,
               timeout=240 if api == "torch" else 120, env={run_folder.ENV: str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    for rank in json.loads(out.read_text())["ranks"]:
        runs, want = rank["runs"], expected(api, rank["rank"])
        assert sorted(runs) == sorted(want)
        for hazard, line in want.items():
            got = [r["reports"] for r in runs[hazard]]
            assert got == [[line] if line else []] * RUNS, (rank["rank"], hazard, got)
        assert [r["arrived"] for r in runs["write"]] == ["new"] * RUNS  # the overwrite arrives, every run
        assert [r["early"] for r in runs["read"]] == ["nan"] * RUNS     # an early read sees poison


def test_a_strict_run_stops_at_the_first_hazard_with_its_line(tmp_path):
    proc = run([PLANTED, "--strict", "write", "--sanitize"], tmp_path, timeout=60)
    want = expected("mpi4py")["write"].split(": ", 1)
    assert proc.returncode != 0
    # both ranks plant it; the first to stop ends the other, maybe before it spoke. Each line whole:
    # Open MPI forwards the ranks' output line by line, so the other's may come between
    lines = proc.stderr.splitlines()
    said = [r for r in (0, 1) if f"sanitize: rank {r}: {want[0]}" in lines]
    assert said and f"  {want[1]}" in lines, proc.stderr[-2000:]


def test_a_request_never_waited_fails_the_run_at_exit(tmp_path):
    proc = run([PLANTED, "--strict", "never"], tmp_path, timeout=60, env={"TUTOR_SANITIZE": "1"})
    assert proc.returncode == 3, (proc.returncode, proc.stderr[-2000:])
    assert expected("mpi4py")["never"].split(": ", 1)[1] in proc.stderr
    assert re.search(r"sanitize: rank 0 checked 1 sends, 1 receives: 1 reports", proc.stdout), proc.stdout


def test_a_correct_lesson_passes_sanitized_with_debug_collectives(tmp_path):
    out = tmp_path / "r.json"
    proc = run(["lessons/13_ring_attention.py", "--seq", "101", "--dim", "16", "--reps", "1", "--sanitize",
                "--debug-collectives", "--json", str(out)], tmp_path, timeout=120)  # p2p.start's ring
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "sanitize: rank" not in proc.stderr
    checked = re.search(r"sanitize: rank 0 checked (\d+) sends, (\d+) receives: no reports", proc.stdout)
    assert checked and int(checked[1]) > 0 and int(checked[2]) > 0, proc.stdout[-1000:]


@pytest.mark.parametrize("lesson, np_, api", [
    ("14", 2, "mpi4py"), pytest.param("10", 3, "torch", marks=pytest.mark.torch)])
def test_a_lesson_that_does_nothing_wrong_passes_sanitized(lesson, np_, api, tmp_path):
    """Lessons whose own bookkeeping the sanitizer once upset, with nothing wrong: 14 counts the calls it
    records (the sanitizer recorded them again), 10 the bytes it holds until Python frees them (the
    sanitizer kept torch's sent tensors alive)."""
    args = catalog.resolve(lesson, os.path.join(ROOT, "lessons")).meta.get("args", [])
    out = tmp_path / "r.json"
    done = tutor("run", lesson, "-n", str(np_), "--api", api, "--json", str(out), "--", *map(str, args),
                 "--sanitize", timeout=240)
    doc = json.loads(out.read_text())
    assert done.returncode == 0 and doc["status"] == "pass", done.stdout[-3000:] + done.stderr[-2000:]
    said = [line for line in done.stdout.splitlines() if line.startswith("sanitize: rank 0 ")]
    assert said and ("no reports;" in said[0] or "nothing to check" in said[0]), said


def test_a_sanitized_run_gets_three_times_the_lessons_limit(monkeypatch):
    """NCCL's order costs a token each way per transfer (lesson 15 on torch at NP 6: 16 s plain, 28-71 s
    sanitized on 2 busy cores, past its 120 s once): --sanitize, or TUTOR_SANITIZE=1 as `check
    --sanitize` sets it, gets lesson_run.SANITIZED_SLOWER times the YAML's limit; a practice run's
    buffers-only mode, and a plain run, keep it."""
    lesson = catalog.resolve("15", os.path.join(ROOT, "lessons"))
    limit = lesson.meta["timeout_s"]
    monkeypatch.delenv("TUTOR_SANITIZE", raising=False)
    assert lesson_run.limit(lesson) == limit
    assert lesson_run.limit(lesson, ["--groups", "2x3:block", "--sanitize"]) == lesson_run.SANITIZED_SLOWER * limit
    monkeypatch.setenv("TUTOR_SANITIZE", "buffers")
    assert lesson_run.limit(lesson) == limit
    monkeypatch.setenv("TUTOR_SANITIZE", "1")
    assert lesson_run.limit(lesson) == lesson_run.SANITIZED_SLOWER * limit
