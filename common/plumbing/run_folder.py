"""The run folder: what the runner and the ranks leave each other, named in one place.

The runner makes one folder per run (common/runner/stop_signals.py) and gives it to every rank as
$TUTOR_RUN_DIR; it removes the folder when the run is over. What lies in it:

  results.json       the results JSON rank 0 writes (report.finish; the runner passes its path as
                     $TUTOR_RESULTS) and the runner reads
  rankR.pid          rank R's process id, so the runner can signal and end it (watchdog)
  rankR.stack        rank R's stack dump, written when the runner sends SIGUSR1 (watchdog)
  rankR.error        the exception that killed rank R, one line (watchdog)
  rankR.flight       rank R's flight recorder, the calls it made (flight)
  rankR.stderr       a planted fault's rank R's error output (lesson 14 writes it: lessons/hung_job/show.py)
  planted.json       what a lesson that breaks on purpose broke (flight.plant; flightwatch reads it)
  blocked            why the lesson refused: what it needs is missing here (bootstrap's ctx.fail)
  refused            rank 0's one line on bad flags, which the other ranks wait for (bootstrap)
  wrong-world        a process found itself in the wrong world (world.confirm): the run is a crash
  ran-NAME           a practice copy's region NAME ran (practice_grading's recorder line)
  sanitize-cycle-K-rankR   rank R saw the K-th deadlock cycle of the sanitized streams (sanitize)
  tmp/               $TMPDIR of the launcher and the ranks, removed with the folder
  mine/              the practice copy that `check --mine` launches
  ft-store           lesson 18's FileStore (lessons/fault_tolerance/quorum.py names it itself)

Imports nothing but os and re: the ranks import it before MPI starts.
"""
import os
import re

ENV = "TUTOR_RUN_DIR"  # the variable that hands the folder to the ranks
RAN = "ran-"           # ran-NAME
WRONG_WORLD = "wrong-world"


def given():
    """The run folder the runner gave this process, or None (a lesson run by hand)."""
    return os.environ.get(ENV) or None


def seen():
    """given(), when this process can see it (a node that does not share it cannot), else None."""
    run_dir = given()
    return run_dir if run_dir and os.path.isdir(run_dir) else None


def rank_file(run_dir, rank, kind):
    """rankR.KIND: kind is pid, stack, error, flight or stderr."""
    return os.path.join(run_dir, f"rank{rank}.{kind}")


def rank_files(run_dir, kind):
    """{rank: path} of the rankR.KIND files in the folder now, in rank order."""
    found = {}
    for name in os.listdir(run_dir):
        m = re.fullmatch(rf"rank(\d+)\.{re.escape(kind)}", name)
        if m:
            found[int(m.group(1))] = os.path.join(run_dir, name)
    return dict(sorted(found.items()))


def results(run_dir):
    return os.path.join(run_dir, "results.json")


def planted(run_dir):
    return os.path.join(run_dir, "planted.json")


def blocked(run_dir):
    return os.path.join(run_dir, "blocked")


def refused(run_dir):
    return os.path.join(run_dir, "refused")


def wrong_world(run_dir):
    return os.path.join(run_dir, WRONG_WORLD)


def ran(run_dir, region):
    return os.path.join(run_dir, RAN + region)


def ran_regions(run_dir):
    """The names of the practice regions that left a ran-NAME file."""
    return {name[len(RAN):] for name in os.listdir(run_dir) if name.startswith(RAN)}


def cycle_mark(run_dir, k, rank):
    return os.path.join(run_dir, f"sanitize-cycle-{k}-rank{rank}")


def scratch(run_dir):
    return os.path.join(run_dir, "tmp")


def mine(run_dir):
    return os.path.join(run_dir, "mine")
