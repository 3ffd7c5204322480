"""What a run's outcome means, in words and as data: the lines that say why a run
did not pass (which rank failed, which process a signal killed, where a hung rank was), the status the
results JSON keeps, and the JUnit report."""
import re
import signal

from common.runner import flightwatch, rank_processes
from common.runner.checktable import got_cell, want_cell
from common.text import WIDTH, by_message, path_shown, ranks_of, short

# One status per run, and the exit status `bin/tutor run` ends with (README, "Verdicts and exit codes").
# `interrupted` exits 128 + the signal's number (130 for Ctrl-C), as does a crash in which mpiexec itself
# was killed by a signal.
EXIT = {"pass": 0, "fail": 1, "usage": 2, "crash": 3, "blocked": 4, "unsaved": 5, "timeout": 124}


def status(outcome, checks):
    """The run's verdict as one word (GUIDE §3, Verdicts). run_lesson says `blocked` before launching
    where it can tell; a lesson that finds no GPU per rank itself says so in its run folder."""
    if outcome.interrupted:
        return "interrupted"
    if getattr(outcome, "planted", None) and checks and all(c["ok"] for c in checks):
        return "pass"  # a fault planted on purpose (lesson 14), diagnosed right
    if outcome.timed_out:
        return "timeout"
    if getattr(outcome, "wrong_world", None):  # every rank alone in a world of its own: never a pass
        return "crash"
    if ok(outcome, checks):
        return "pass"
    if outcome.blocked and refused(outcome, checks):
        return "blocked"
    if refused(outcome, checks):
        return "usage"
    return "crash" if checks is None or outcome.rc != 0 else "fail"


def expected_death(outcome):
    """The run's status for a lesson whose YAML says expects_death: 0 when the ranks that did not end
    with status 0 are only the one its results say it killed (summary.killed), hydra reporting each
    rank's status; else the launcher's own. Open MPI with ULFM exits 0 itself when the others did."""
    results = outcome.results or {}
    summary = results.get("summary") or {}
    killed, statuses = summary.get("killed"), outcome.statuses or []
    if outcome.rc == 0 or not isinstance(killed, int) or outcome.timed_out:
        return outcome.rc
    if not statuses:  # hydra on several hosts lists them by host: then the survivors' own word, all of
        # them (results are written only after every survivor reached the end together)
        return 0 if summary.get("survivors") == results.get("np", 0) - 1 >= 1 else outcome.rc
    if not 0 <= killed < len(statuses):
        return outcome.rc
    others = [s for r, s in enumerate(statuses) if r != killed]
    return 0 if statuses[killed] and not any(others) else outcome.rc


def exit_code(outcome, checks):
    """EXIT[status]; 128 + the signal when the runner was interrupted or mpiexec itself was killed
    (a crash whose cause the runner cannot know: README, Troubleshooting)."""
    return outcome.rc if outcome.interrupted or outcome.launcher else EXIT[status(outcome, checks)]


def ok(outcome, checks):
    return outcome.rc == 0 and checks is not None and all(c["ok"] for c in checks)


def refused(outcome, checks):
    """The lesson itself refused its flags (every rank exited 2 before reporting, no rank failed)."""
    return (outcome.rc == 2 and checks is None and not outcome.errors and not outcome.launcher
            and killed_rank(outcome) is None)


def explain(lesson, outcome, checks):
    """Lines saying why a run did not pass, in the learner's words; [] when it passed."""
    lines = []
    if outcome.interrupted:
        how = "Ctrl-C" if outcome.signal in (None, signal.SIGINT) else _signal_name(outcome.signal)
        return [f"interrupted by {how}: every process of the run was ended"]
    if getattr(outcome, "planted", None) and not getattr(outcome, "wrong_world", None):
        return flightwatch.planted_lines(lesson, outcome, checks, short)  # lesson 14: the diagnosis first
    if outcome.timed_out:
        lines.append(flightwatch.opening(lesson, outcome))
        places = {}
        for rank in outcome.stacks:
            if not outcome.stacks[rank][0][1]:  # no stack: the process state (rank_processes.dump_stacks)
                places[rank] = outcome.stacks[rank][0][0]
                continue
            own, inner = rank_processes.blocked_at(outcome.stacks[rank])
            where = f"{own[0]}() at {own[1]}" if own else "?"
            places[rank] = where + (f"  (inside {inner[0]}() at {inner[1]})" if inner and inner != own else "")
        lines += [f"  {ranks_of(ranks)}: {where}" for ranks, where in by_message(places)]
        if not outcome.stacks:
            lines.append("  (no rank answered the stack-dump request: it hung before joining MPI)")
        return lines + flightwatch.lines(outcome)
    if getattr(outcome, "wrong_world", None):
        return [outcome.wrong_world]
    # an MPI error on a rank is often only the echo of a peer that died: it names no culprit itself,
    # unless its class says the rank's own call was wrong (a truncated receive, a bad count or rank)
    echoes = {r: e for r, e in outcome.errors.items() if may_echo(e)}
    own = {r: e for r, e in outcome.errors.items() if r not in echoes}
    lines += [f"{ranks_of(ranks)} failed: {e}" for ranks, e in by_message(own)]
    killed = killed_rank(outcome, set(echoes)) if outcome.rc != 0 and not own else None
    if own and outcome.rc != 0 and not outcome.launcher:  # a signal that came with it or after: said too
        lines += [f"{_rank_pid(outcome, r)} was {'then ' if r in own else ''}killed by {_signal_name(s)}"
                  + ("" if r in own else " as well") for r, s in sorted(signalled(outcome).items())]
    if outcome.launcher:
        pid, sig = outcome.launcher
        lines += [f"mpiexec itself (pid {pid}) was killed by {_signal_name(sig)}; the runner ended the "
                  "ranks it left", "what sent that signal cannot be known from here"]
    elif killed:
        lines.append(killed)
    lines += [f"{ranks_of(ranks)} {'then failed (a peer was gone)' if killed else 'failed'}: {e}"
              for ranks, e in by_message(echoes)]
    if outcome.rc != 0 and not (outcome.launcher or killed or outcome.errors):
        last = last_said(outcome.tail)
        if blocked_not_gpu(outcome, checks):
            return [f"blocked: {outcome.blocked}"]  # not a GPU (lesson 18's ULFM): its own line
        if outcome.blocked and refused(outcome, checks):  # ctx.fail(blocked=True): its line said why
            return ["blocked: the lesson needs a usable GPU on every rank (its line above says what is "
                    "missing);", "  `bin/tutor doctor` tells what this machine has, --device cpu runs it here"]
        if refused(outcome, checks):  # a lesson's flag parser or ctx.fail(): one line said why
            return [f"the lesson refused to run: {last}"]
        last = traceback_end(outcome.tail) or last
        lines.append(f"the lesson exited with status {outcome.rc}" + (f": {last}" if last else ""))
    if outcome.bad_results:
        lines.append(f"its results file could not be read ({outcome.bad_results}), so nothing was checked")
    elif checks is None and outcome.rc != 0:
        lines.append("it ended before writing its results, so nothing could be checked")
    elif checks is None:
        lines.append("it exited 0 but wrote no results: the lesson must call report.finish()")
    else:
        lines += [f"check failed: {c['name']}: got {got_cell(c)}" + (f"; wanted {c['rule']}" if c.get("rule")
                  else f", want {want_cell(c)}") for c in checks if not c["ok"]]
    return lines + flightwatch.lines(outcome)


def last_said(tail):
    """The line of the output that says why a run ended: the last one that reads as an error within the
    last 40 lines (a launcher's closing banner of dashes and exit codes says nothing), else the last line
    with a word in it."""
    worded = [l.strip() for l in tail if re.search(r"[A-Za-z]{2}", l)]
    said = next((l for l in reversed(worded[-40:]) if _SAYS_WHY.search(l)), None)
    return said or (worded[-1] if worded else "")


_SAYS_WHY = re.compile(r"error|abort|fatal|fail|cannot|can't|unable|not found|no such|mismatch|refus|"
                       r"denied|invalid|killed", re.I)


def blocked_not_gpu(outcome, checks):
    """The lesson refused to run for want of something other than a GPU (lesson 18's ULFM)."""
    return bool(outcome.blocked and refused(outcome, checks) and "GPU" not in outcome.blocked)


def said_above(outcome, checks):
    """True for a blocked run whose reason the lesson's own line already printed, word for word, and
    that has nothing to add (a GPU's blocked run adds where to look): the runner does not say it again."""
    return (status(outcome, checks) == "blocked" and blocked_not_gpu(outcome, checks)
            and any(outcome.blocked in line for line in outcome.tail))


def summary(verdict, head, why, width=WIDTH):
    """The run's last line: the status, what ran, and, when it did not pass, why, in a few words."""
    line = f"{verdict.upper()}  {head}"
    first = next((w.strip() for w in why if w.strip()), "") if verdict != "pass" else ""
    timed = re.match(r"TIMEOUT: \S+ (ran past its .*? limit)|STUCK: \S+: (every rank waited)", first)
    cause = re.sub(r"^the lesson exited with (status \d+): ", r"\1: ", timed.group(timed.lastindex) if timed else first)
    cause = cause.rstrip(":")
    room = width - len(line) - 2
    if not cause or room < 12:
        return line
    return f"{line}: {cause if len(cause) <= room else cause[:room - 1] + '…'}"


MPI_ERROR = "MPI.Exception:"   # how common/plumbing/watchdog.py writes mpi4py's errors, then the error class
# the classes a rank may get because a peer died or the job is being torn down; any other class (or a
# line without one) is the rank's own call going wrong, as MPI_ERR_TRUNCATE is
PEER_CLASSES = ("MPI_ERR_OTHER", "MPI_ERR_INTERN", "MPI_ERR_UNKNOWN", "MPI_ERR_PROC_FAILED",
                "MPI_ERR_PROC_FAILED_PENDING", "MPI_ERR_PROC_ABORTED", "MPI_ERR_REVOKED", "MPI_ERR_PENDING",
                "MPI_ERR_IN_STATUS")


def may_echo(error):
    """True for an mpi4py error that may be the echo of a dead peer (its class, or no class given)."""
    if not error.startswith(MPI_ERROR):
        return False
    cls = re.match(r"(MPI_ERR_\w+)", error[len(MPI_ERROR):].strip())
    return cls is None or cls[1] in PEER_CLASSES
_FILE_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')
_ERROR_LINE = re.compile(r"^(?P<kind>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): ?(?P<msg>.*)$")


def traceback_end(tail):
    """'KindError: message (file:line)' from the last Python traceback in the output (an error raised
    before the lesson reached MPI, where no rank's error file exists yet), or None."""
    for i in range(len(tail) - 1, -1, -1):
        m = _ERROR_LINE.match(tail[i])
        if not m:
            continue
        where = next((f for f in (_FILE_LINE.match(t) for t in reversed(tail[:i])) if f), None)
        at = f" ({path_shown(where['file'])}:{where['line']})" if where else ""
        return f"{m['kind']}: {m['msg'].strip()}{at}"
    return None


def killed_rank(outcome, echoes=()):
    """Which rank ended the run, in words: killed by a signal, or (from hydra's statuses) gone with an
    exit status of its own while the others were not; None when the launcher's report names none.

    hydra ends the other ranks with SIGKILL once one dies, so with every rank's status (Outcome.statuses)
    a SIGKILL is the culprit's only when no rank died another way. When several ranks show SIGKILL only,
    nothing the launcher reports says which died first, and the line says so. Without the statuses, Open
    MPI's "process rank R ... exited on signal S" is read, or hydra's banner PID (several hosts) is mapped.
    `echoes`: ranks that left with only an MPI error, the echo of a dead peer; never named the culprit.
    """
    statuses = outcome.statuses or []
    sig_of = {r: s & 0x7F for r, s in enumerate(statuses) if 0 < s & 0x7F < 0x7F}
    code_of = {r: s >> 8 for r, s in enumerate(statuses) if s & 0x7F == 0 and s >> 8 and r not in echoes}
    if len(code_of) == len(statuses) > 0 and len(set(code_of.values())) == 1:
        return None  # every rank left with one status: the lesson's own exit (a refused flag), not one rank's
    culprits = {r: s for r, s in sig_of.items() if s != signal.SIGKILL}
    if not culprits and not code_of:
        culprits = sig_of  # SIGKILL only: the culprit is among them
        if len(culprits) > 1:
            who = " and ".join(_rank_pid(outcome, r) for r in sorted(culprits))
            return (f"{who} were killed by {_signal_name(signal.SIGKILL)}: one of them died and mpiexec ended "
                    "the others with the same signal; its report cannot tell which came first")
    parts = [f"{_rank_pid(outcome, r)} was killed by {_signal_name(s)}" for r, s in sorted(culprits.items())]
    parts += [f"{_rank_pid(outcome, r)} exited with status {c}" for r, c in sorted(code_of.items())]
    if parts:
        return "; ".join(parts) + "; mpiexec then ended the other ranks"
    if statuses:
        return None  # hydra reported every rank and none ended the run
    text = "\n".join(outcome.tail)
    ompi = _OMPI_KILLED.search(text)
    if ompi:  # Open MPI names the rank itself (its PID is 0 in some versions: ours is then used)
        rank, pid, sig = map(int, ompi.groups()[1:])
        who = f"rank {rank} (pid {pid})" if pid else _rank_pid(outcome, rank)
        return f"{who} was killed by {_signal_name(sig)}; {ompi[1]} then ended the other ranks"
    pid = re.search(r"PID (\d+) RUNNING AT", text)
    sig = re.search(r"signal (\d+)", text)
    if not pid:
        return None
    by_pid = {p: r for r, p in outcome.pids.items()}
    who = f"rank {by_pid[int(pid.group(1))]}" if int(pid.group(1)) in by_pid else "a rank"
    how = f"was killed by {_signal_name(int(sig.group(1)))}" if sig else "ended abnormally"
    return f"{who} (pid {pid.group(1)}) {how}; mpiexec then ended the other ranks"


# Open MPI's report of a rank a signal ended, launcher first (mpirun in 4.x, prterun in 5.x); it wraps
# its lines anywhere, "exited on" / "signal 11" included
_OMPI_KILLED = re.compile(r"(\S+) noticed that process rank (\d+) with PID (\d+) on node\s+\S+\s+exited\s+"
                          r"on\s+signal\s+(\d+)")


def signalled(outcome):
    """{rank: signal} of the ranks a signal ended, but SIGKILL (how launchers end the rest), from
    hydra's statuses or Open MPI's report."""
    if outcome.statuses:
        return {r: s & 0x7F for r, s in enumerate(outcome.statuses)
                if 0 < s & 0x7F < 0x7F and s & 0x7F != signal.SIGKILL}
    ompi = _OMPI_KILLED.search("\n".join(outcome.tail))
    return {int(ompi[2]): int(ompi[4])} if ompi and int(ompi[4]) != signal.SIGKILL else {}


def _rank_pid(outcome, rank):
    return f"rank {rank} (pid {outcome.pids[rank]})" if rank in outcome.pids else f"rank {rank}"


def _signal_name(sig):
    name = f" ({signal.Signals(sig).name})" if sig in signal.valid_signals() else ""
    return f"signal {sig}{name}"
