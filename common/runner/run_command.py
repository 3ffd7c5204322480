"""`bin/tutor run`: one lesson (or, with --mine, the learner's copy) checked before anything is
launched, launched, its checks and verdict said, and its results JSON kept (--json). bin/tutor only
reads the flags, prints what this says and exits with what it returns, as `check` does with
common/runner/check_command.py."""
import json

from common.plumbing import guard
from common.runner import checktable, exercise, lesson_run, mpi_launchers, output_files, practice, preflight, verdict
from common.runner.check_command import Interrupted
from common.text import fit


class Ended(Exception):
    """The run ends before a verdict is said: `tutor: LINE` on stderr, then exit `rc` (a usage error
    unless said otherwise; a run that is blocked or cannot start exits as its verdict does)."""

    def __init__(self, line, rc=verdict.EXIT["usage"]):
        super().__init__(line)
        self.line, self.rc = line, rc


def run(lesson, np, api, device, json_path, timeout, force, mine, args, lesson_args, echo):
    """Run `lesson` as `bin/tutor run` does; return the exit status. `args` are the words typer did not
    take (the lesson's flags), `lesson_args` those after `--`; echo(text, err=False) prints one line.
    Raises Ended (one line, said before any launch or instead of one) or check_command.Interrupted."""
    try:
        script = practice.mine_or_fail(lesson) if mine else None
        if preflight.wants_help(args):  # your copy takes the lesson's flags: its help is theirs
            preflight.check_script(lesson.path)
            return lesson_run.lesson_help(lesson)
        n = preflight.parse_np(np, lesson)
        preflight.check_request(lesson, n, api, device)
        preflight.parse_timeout(timeout)
        preflight.check_extra(args)
        extra = output_files.lesson_outputs(args)  # vetted and made absolute: the ranks run in the root
        if json_path is not None:
            preflight.check_json_target(json_path)
        splice = practice.splice_mine(lesson) if mine else None  # as `check --mine` grades it
    except (preflight.UsageError, mpi_launchers.LaunchError, output_files.FileError, exercise.PracticeError) as exc:
        raise Ended(str(exc)) from None
    try:
        preflight.check_script(script or lesson.path)
        preflight.needs(lesson, n, api, device, force)
    except mpi_launchers.LaunchError as exc:  # MPIEXEC names no program (asked for srun's PMI)
        raise Ended(str(exc)) from None
    except (preflight.ScriptError, preflight.Blocked) as exc:
        status = "blocked" if isinstance(exc, preflight.Blocked) else "crash"
        why = f"{status}: {exc}" if status == "blocked" else str(exc)
        if json_path is not None:  # a run never launched is kept too; a file it cannot write is the error
            try:
                keep_results(json_path, lesson, n, api, device, None, None, status, [why])
            except preflight.UsageError as bad:
                raise Ended(str(bad)) from None
        raise Ended(why, verdict.EXIT[status]) from None
    for line in practice.running_mine(lesson, script, splice) if mine else []:
        echo(fit(line))
    try:
        outcome, checks = lesson_run.run_lesson(lesson, n, api, device, extra, timeout, splice=splice)
    except (preflight.UsageError, mpi_launchers.LaunchError) as exc:
        raise Ended(str(exc)) from None
    why = verdict.explain(lesson, outcome, checks)
    status, rc = verdict.status(outcome, checks), verdict.exit_code(outcome, checks)
    if mine:  # said for a learner, as `check --mine` says it
        why = exercise.explain_for_learner(lesson, outcome, checks, script, why)
        status, why = practice.graded_verdict(splice, outcome, status, why)

    def keep():  # after the verdict is said: a results file that fails to write loses nothing
        try:
            if json_path is not None:
                keep_results(json_path, lesson, n, api, device, outcome.results, checks, status, why,
                                    outcome.diagnosis)
        except preflight.UsageError as exc:
            return [fit(f"tutor: warning: {exc}; the verdict above stands")]
        return []
    if outcome.interrupted:
        raise Interrupted(why + keep(), outcome.rc)
    if checks:
        echo("\n" + checktable.checks_table(checks))
    told = [] if verdict.said_above(outcome, checks) else why  # the JSON keeps why all the same
    for line in told:
        echo(fit(line), err=True)
    echo(verdict.summary(status, f"{lesson.name}  np={n} api={api}  ({outcome.seconds:.1f} s)", told))
    for line in practice.after_run(lesson, status, n, api, device, mine, lesson_args):
        echo(fit(line, indent="    "), err=status != "pass")
    unsaved = keep()
    for line in unsaved:
        echo(line, err=True)
    return rc or (verdict.EXIT["unsaved"] if unsaved else 0)


def keep_results(path, lesson, np, api, device, results, checks, status, why, diagnosis=None):
    """The results JSON the learner asked for: the lesson's results (or what is known of the run),
    the checks, one status and the lines that say why it is not `pass`; never over a file that is not
    an earlier one (UsageError). A blocked run, never launched, is kept too."""
    doc = results or {"lesson": lesson.name, "np": np, "api": api, "device": device, "ranks": []}
    doc = {**doc, "checks": checks or [], "ok": status == "pass", "status": status, "why": why}
    if diagnosis:  # the first divergence of the ranks' flight records (common/runner/diagnose.py)
        doc["diagnosis"] = diagnosis
    text = json.dumps(doc, indent=1) + "\n"
    try:
        output_files.write_new(path, text, "--json", "results JSON", guard.is_results_json)
    except output_files.FileError as exc:
        raise preflight.UsageError(str(exc)) from None
    except OSError as exc:
        raise preflight.UsageError(f"--json {path}: could not write it: {exc.strerror}") from None
