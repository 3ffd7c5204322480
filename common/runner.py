"""What `bin/tutor run` and `check` do: validate the request, launch, check the results, explain."""
import os
import re
import signal

from common import catalog, devices, expect, launch, rundir
from common.report import atomic_write, table


class UsageError(ValueError):
    """Bad input: one line for the learner, exit status 2."""


def parse_np(text, lesson):
    if text is None:
        return lesson.meta["np"]["default"]
    try:
        np = int(str(text).strip())
    except ValueError:
        raise UsageError(f"NP must be a whole number, got {text!r}") from None
    lo, hi = lesson.np_range
    if np < 1:
        raise UsageError(f"NP must be at least 1, got {np}")
    if np < lo or (hi is not None and np > hi):
        span = f"{lo}..{hi}" if hi is not None else f"at least {lo}"
        raise UsageError(f"{lesson.name} runs with NP {span}, got {np}")
    return np


def validate(lesson, np, api, device):
    """The pre-flight checks that need no MPI: API offered, device possible on this machine."""
    if api not in lesson.meta["apis"]:
        raise UsageError(f"{lesson.name} offers --api {' or '.join(lesson.meta['apis'])}, not {api!r}")
    if device not in devices.DEVICES:
        raise UsageError(f"--device must be auto, cpu or gpu, not {device!r}")
    if lesson.needs_gpu and device == "cpu":
        raise UsageError(f"{lesson.name} needs a GPU; it has no --device cpu path")
    if device == "gpu" or lesson.needs_gpu:
        n, why = devices.visible_gpus()
        local = np if not os.environ.get("MPIEXEC") else 1  # across nodes only the ranks can tell
        if n == 0:
            raise UsageError(f"--device gpu: no usable GPU here ({why}); use --device cpu or auto")
        if local > n:
            raise UsageError(f"--device gpu: {np} ranks but {n} GPU(s) on this node; NCCL needs one GPU "
                             "per rank (lower -n or use --device cpu)")


def run_lesson(lesson, np, api, device, extra=(), json_path=None, timeout=None, echo=True, script=None):
    """Launch one lesson; return (outcome, checks). checks is None when there were no results."""
    args = ["--api", api, "--device", device, *extra]
    cmd = launch.command(script or lesson.path, np, args)
    if echo:
        print("$ " + " ".join(cmd), flush=True)
        if np > launch.usable_cores():
            print(f"note: {np} ranks on {launch.usable_cores()} usable cores: the ranks share cores, "
                  "so timings will be distorted (results are still checked)", flush=True)
    outcome = launch.run(cmd, timeout or lesson.meta["timeout_s"], json_path, echo=echo)
    checks = expect.run_checks(lesson.meta["expect"], outcome.results) if outcome.results else None
    return outcome, checks


def ok(outcome, checks):
    return outcome.rc == 0 and checks is not None and all(c["ok"] for c in checks)


def checks_table(checks):
    rows = [(c["name"], _short(c["got"]), c["want"], "✓" if c["ok"] else "✗") for c in checks]
    return table(["check", "got", "want", ""], rows, align=[False, False, False, False])


def _short(value, limit=60):
    text = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def explain(lesson, outcome, checks):
    """Lines saying why a run did not pass, in the learner's words; [] when it passed."""
    lines = []
    if outcome.interrupted:
        return ["interrupted: every rank was ended"]
    if outcome.timed_out:
        lines.append(f"TIMEOUT: {lesson.name} ran past its {outcome.limit:g} s limit; every rank was ended. "
                     "Where each rank was:")
        for rank in sorted(outcome.stacks):
            own, inner = rundir.blocked_at(outcome.stacks[rank])
            where = f"{own[0]}() at {own[1]}" if own else "?"
            deeper = f"  (inside {inner[0]}() at {inner[1]})" if inner and inner != own else ""
            lines.append(f"  rank {rank}: {where}{deeper}")
        if not outcome.stacks:
            lines.append("  (no rank answered the stack-dump request: it hung before joining MPI)")
        return lines
    for rank in sorted(outcome.errors):
        lines.append(f"rank {rank} failed: {outcome.errors[rank]}")
    killed = killed_rank(outcome) if outcome.rc != 0 and not outcome.errors else None
    if killed:
        lines.append(killed)
    elif outcome.rc == 2 and checks is None:  # a lesson's flag parser or ctx.fail(): one line said why
        last = next((l for l in reversed(outcome.tail) if l.strip()), "")
        return [f"the lesson refused to run: {last.strip()}"]
    elif outcome.rc != 0 and not outcome.errors:
        last = next((l for l in reversed(outcome.tail) if l.strip()), "")
        lines.append(f"the lesson exited with status {outcome.rc}" + (f": {last.strip()}" if last else ""))
    if checks is None and outcome.rc != 0:
        lines.append("it ended before writing its results, so nothing could be checked")
    elif checks is None:
        lines.append("it exited 0 but wrote no results: the lesson must call report.finish()")
    else:
        lines += [f"check failed: {c['name']}: got {_short(c['got'])}, want {c['want']}"
                  for c in checks if not c["ok"]]
    return lines


def killed_rank(outcome):
    """Which rank ended the run, in words: killed by a signal, or (from hydra's statuses) gone with an
    exit status of its own while the others were not; None when the launcher's report names none.

    hydra ends the other ranks with SIGKILL once one dies, so with every rank's status (Outcome.statuses)
    a SIGKILL is the culprit's only when no rank died another way. When several ranks show SIGKILL only,
    nothing the launcher reports says which died first, and the line says so. Without the statuses, Open
    MPI's "process rank R ... exited on signal S" is read, or hydra's banner PID (several hosts) is mapped.
    """
    statuses = outcome.statuses or []
    sig_of = {r: s & 0x7F for r, s in enumerate(statuses) if 0 < s & 0x7F < 0x7F}
    code_of = {r: s >> 8 for r, s in enumerate(statuses) if s & 0x7F == 0 and s >> 8}
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
    ompi = re.search(r"process rank (\d+) with PID (\d+) on node\s+\S+\s+exited on signal (\d+)", text)
    if ompi:  # Open MPI names the rank itself (its PID is 0 in some versions: ours is then used)
        rank, pid, sig = map(int, ompi.groups())
        who = f"rank {rank} (pid {pid})" if pid else _rank_pid(outcome, rank)
        return f"{who} was killed by {_signal_name(sig)}; mpirun then ended the other ranks"
    pid = re.search(r"PID (\d+) RUNNING AT", text)
    sig = re.search(r"signal (\d+)", text)
    if not pid:
        return None
    by_pid = {p: r for r, p in outcome.pids.items()}
    who = f"rank {by_pid[int(pid.group(1))]}" if int(pid.group(1)) in by_pid else "a rank"
    how = f"was killed by {_signal_name(int(sig.group(1)))}" if sig else "ended abnormally"
    return f"{who} (pid {pid.group(1)}) {how}; mpiexec then ended the other ranks"


def _rank_pid(outcome, rank):
    return f"rank {rank} (pid {outcome.pids[rank]})" if rank in outcome.pids else f"rank {rank}"


def _signal_name(sig):
    name = f" ({signal.Signals(sig).name})" if sig in signal.valid_signals() else ""
    return f"signal {sig}{name}"


def write_junit(path, cases):
    """A JUnit XML file for CI dashboards: one testcase per lesson x NP x API."""
    from xml.sax.saxutils import escape, quoteattr
    failed = sum(not c[4] for c in cases)
    parts = [f'<testsuite name="tutor-check" tests="{len(cases)}" failures="{failed}">']
    for lesson, n, api, outcome, passed, why in cases:
        parts.append(f'  <testcase classname={quoteattr(lesson.name)} name="np{n}-{api}" '
                     f'time="{outcome.seconds:.2f}">')
        if not passed:
            parts.append(f'    <failure message={quoteattr(why[0] if why else "failed")}>'
                         f'{escape(chr(10).join(why + outcome.tail[-40:]))}</failure>')
        parts.append("  </testcase>")
    parts.append("</testsuite>\n")
    atomic_write(path, "\n".join(parts))
