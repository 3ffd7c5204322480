"""bin/tutor's commands (typer): list, run, check, hint, practice, solution, why, doctor, testbed,
busbw. A command reads its flags, calls the module that does its work (run: run_command.py, check:
check_command.py, practice, hint and solution: practice.py), prints what that returns and exits with its
status. bin/tutor finds the Python the kit runs in, then hands over to `app`."""
import difflib
import os
import sys
from typing import List, Optional

import typer
import typer.core

from common.runner import (
    catalog,
    check_command,
    exercise,
    flightwatch,
    mpi_launchers,
    output_files,
    practice,
    preflight,
    run_command,
    verdict,
)
from common.text import fit, table

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode="markdown",  # a paragraph of --help is one paragraph, rewrapped
                  help="The collectives tutor: distributed communication for ML, learned by running it.")
EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}


def die(message, code=2):
    typer.echo(f"tutor: {message}", err=True)
    raise typer.Exit(code)


def lesson_or_die(lesson_id):
    try:
        return catalog.resolve(lesson_id)
    except catalog.CatalogError as exc:
        die(str(exc))


@app.command("list")
def list_lessons():
    """The lessons, one line each: id, name, NP, APIs, GPU, your last run of it (✓ = passed) and your
    practice (✓ passed, in progress, not started). The README's Lessons table says what each teaches."""
    rows, broken = [], []
    for lesson in catalog.lessons():
        try:
            meta = catalog.load_yaml(lesson.yaml_path)
        except catalog.CatalogError as exc:
            rows.append((lesson.id, lesson.name[3:], "", "", "", "", "broken YAML (below)"))
            broken.append(fit(f"{lesson.id}: broken YAML: {exc}"))
            continue
        lesson.meta = meta
        lo, hi = lesson.np_range
        rows.append((lesson.id, lesson.name[3:], f"{meta['np']['default']} ({lo}..{hi if hi else ''})",
                     ",".join(meta["apis"]), "yes" if lesson.needs_gpu else "no", practice.run_mark(lesson),
                     practice.STATE_MARK[practice.state(lesson)]))
    typer.echo(table(["id", "lesson", "NP (range)", "apis", "GPU", "run", "practice"], rows))
    for line in broken:
        typer.echo(line)
    typer.echo("next: `bin/tutor run ID` runs one; `bin/tutor practice ID` writes your copy of its exercise")


class SplitAtDashes(typer.core.TyperCommand):
    """Keeps what came after `--` apart (ctx.meta["lesson_args"]): anything else the command did not
    know was typed for the runner, misspelt or misplaced, and is refused before a launch."""

    def parse_args(self, ctx, args):
        ctx.meta["lesson_args"] = args[args.index("--") + 1:] if "--" in args else []
        return super().parse_args(ctx, args)


def not_ours(ctx):
    """One line for runner options the command does not know, typed before `--` (None if none)."""
    after = ctx.meta.get("lesson_args", [])
    stray = ctx.args[:len(ctx.args) - len(after)] if len(after) <= len(ctx.args) else ctx.args
    if not stray:
        return None
    word = stray[0].split("=", 1)[0]
    known = [o for p in ctx.command.params for o in p.opts if o.startswith("--")]
    if word == "--junit":
        return f"{word} is an option of `bin/tutor check`, not of `run`"
    near = difflib.get_close_matches(word, known, n=1, cutoff=0.75) if word.startswith("-") else []
    if near:
        return f"no option {word}: did you mean {near[0]}?"
    return f"`{word}` is not an option of run; a lesson's own flags go after `--`: run ID -- {word} ..."


@app.command(context_settings=EXTRA, cls=SplitAtDashes)
def run(ctx: typer.Context, lesson_id: str = typer.Argument(..., metavar="ID"),
        np: Optional[str] = typer.Option(None, "-n", "--np", help="number of ranks (default: the lesson's)"),
        api: str = typer.Option("mpi4py", help="mpi4py or torch"),
        device: str = typer.Option("auto", help="auto, cpu or gpu"),
        json_path: Optional[str] = typer.Option(None, "--json", help="keep the results JSON here"),
        timeout: Optional[float] = typer.Option(None, help="seconds before the watchdog ends the run"),
        force: bool = typer.Option(False, "--force", help="allow more ranks than this machine's ceiling"),
        mine: bool = typer.Option(False, "--mine", help="run your practice/ copy (`bin/tutor practice ID`)")):
    """Run one lesson under mpiexec, then check its results against its YAML.

    Extra lesson flags go after `--` (`-- --help` shows the lesson's own), with --mine too:
    `run 05 --mine -- --trace` shows your ring on the whiteboard."""
    stray = not_ours(ctx)
    if stray:
        die(stray)
    lesson = lesson_or_die(lesson_id)
    try:
        rc = run_command.run(lesson, np, api, device, json_path, timeout, force, mine, ctx.args,
                             ctx.meta.get("lesson_args", []), lambda text, err=False: typer.echo(text, err=err))
    except run_command.Ended as exc:
        die(exc.line, exc.rc)
    except check_command.Interrupted as exc:
        interrupted(exc.lines, exc.rc)
    raise typer.Exit(rc)


def interrupted(lines, rc):
    """Say why, then exit 128 + signal; after SIGHUP the terminal may be gone, and the status is what
    counts: output that cannot be written is dropped rather than turned into a traceback."""
    try:
        for line in lines:
            typer.echo(line, err=True)
        sys.stdout.flush()
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    raise typer.Exit(rc)


@app.command()
def check(lesson_ids: Optional[List[str]] = typer.Argument(None, metavar="[ID...]"),
          np: Optional[str] = typer.Option(None, "-n", "--np", help="only this NP (default: the YAML's list)"),
          api: Optional[str] = typer.Option(None, help="only this API (default: every one declared)"),
          device: Optional[str] = typer.Option(None, help="device for every run (default: cpu, or gpu "
                                                          "for a lesson that needs one)"),
          junit: Optional[str] = typer.Option(None, help="also write a JUnit XML report here"),
          mine: bool = typer.Option(False, "--mine", help="check your practice/ copy, not the lesson"),
          force: bool = typer.Option(False, "--force", help="allow more ranks than this machine's ceiling"),
          sanitize: bool = typer.Option(False, "--sanitize", help="every run under --sanitize (NCCL's order, "
                                        "buffers guarded): a report fails the run; 3x the time limits")):
    """Every lesson x every NP in its YAML check list x every API: a summary table.

    With --mine, your practice copy runs against the same checks (make check-mine LESSON=05): regions you have not
    written run the lesson's reference, and a run that never reaches your code is not graded. Once a
    run of a lesson hangs, that lesson's remaining runs are not started. Runs this machine cannot make
    (no GPU, a library missing) are listed as blocked."""
    lessons = [lesson_or_die(i) for i in lesson_ids] if lesson_ids else [
        lesson_or_die(l.name) for l in catalog.lessons()
        if not mine or os.path.exists(practice.copy_path(l))]
    if sanitize:  # the ranks read it (common/bootstrap.py); the runner's limits too (lesson_run.limit)
        os.environ["TUTOR_SANITIZE"] = "1"
    try:
        how = check_command.plan_runs(lessons, np, api, device, mine, force, junit)
    except (exercise.PracticeError, preflight.UsageError, mpi_launchers.LaunchError) as exc:
        die(str(exc))
    except preflight.ScriptError as exc:
        die(str(exc), verdict.EXIT["crash"])
    for line in how.unwritten:
        typer.echo(fit(f"✗ {line}"), err=True)
    if how.unwritten and not how.runs:
        raise typer.Exit(verdict.EXIT["fail"])
    for name, graded in how.graded.items():
        for line in graded.notes():
            typer.echo(fit(f"note: {line}"))
    with check_command.progress_bar(how.runs, "checking", lambda p: f"{p[0].name} np={p[1]} {p[2]}") as bar:
        try:
            rows, cases, hung = check_command.run_all(how, bar, lambda text: typer.echo(fit(text), err=True))
        except (preflight.UsageError, mpi_launchers.LaunchError) as exc:
            die(str(exc))
        except check_command.Interrupted as exc:
            interrupted(exc.lines, exc.rc)
    typer.echo(table(["lesson", "np", "api", "checks", "s", ""], rows))
    for kind, head, why in check_command.problems(cases):
        typer.echo("\n" + fit(f"{kind} {head}:") + "".join("\n" + fit("  " + w, indent="    ") for w in why),
                   err=True)
    for name, where in hung.items():
        typer.echo(f"\n{name}: its other runs were not started once {where} hung", err=True)
    seen = practice.see_failures(cases, {r[0].name: r[3] for r in how.runs}, mine)
    if seen:
        typer.echo("\n" + "\n".join(fit(line, indent="    ") for line in seen), err=True)
    unsaved = []  # files that could not be written once the runs were made: warnings after the tally
    if junit is not None:
        try:
            output_files.write_junit(junit, cases)
        except (output_files.FileError, OSError) as exc:
            unsaved.append(str(exc) if isinstance(exc, output_files.FileError) else
                           f"--junit {junit}: could not write it: {exc.strerror}")
    try:
        for line in check_command.recorded(how, lessons, cases, full=np is None and api is None):
            typer.echo(fit(line))
        for lesson in lessons if mine else []:  # what failed, for `bin/tutor hint` to start from
            practice.remember_failure(lesson, cases)
    except OSError as exc:
        unsaved.append(f"your progress could not be recorded: {exc.strerror}")
    line, rc = check_command.tally(how, cases)
    typer.echo(line)
    for warning in unsaved:
        typer.echo(fit(f"tutor: warning: {warning}"), err=True)
    raise typer.Exit(rc or (verdict.EXIT["unsaved"] if unsaved else 0))


@app.command()
def hint(lesson_id: str = typer.Argument(..., metavar="ID")):
    """The lesson's hints, one more each time you ask: easiest first, or, after a failed
    `check ID --mine`, those closest to the check that failed."""
    lesson = lesson_or_die(lesson_id)
    if practice.state(lesson) == "passed":
        typer.echo(f"✓ you passed {lesson.name}: `bin/tutor solution {lesson.id}` shows the reference to "
                   "compare with")
        raise typer.Exit(0)
    try:
        shown, total = practice.next_hint(lesson)
    except exercise.PracticeError as exc:
        die(str(exc))
    if not shown:
        die(f"{lesson.name} has no hint yet", 1)
    failed = practice.last_failure(lesson)
    if failed:
        more = len(failed["what"]) - 1
        typer.echo(fit(f"your last `check {lesson.id} --mine` failed ({failed['where']}): {failed['what'][0]}"
                       + (f" (and {more} more)" if more > 0 else "") + "; the hints closest to it come first"))
    for i, text in enumerate(shown, 1):  # each line of the hint wrapped on its own: code keeps its lines
        lines = f"hint {i}/{total}: {text}".splitlines()
        typer.echo("\n".join(fit(line if n == 0 else "  " + line, indent="  " if n == 0 else "")
                              for n, line in enumerate(lines)))
    typer.echo(f"(`bin/tutor hint {lesson.id}` again for the next one)" if len(shown) < total else
               f"(that was the last hint; `bin/tutor solution {lesson.id} --force` shows the answer)")


@app.command("practice")
def practice_cmd(lesson_id: str = typer.Argument(..., metavar="ID"),
                 force: bool = typer.Option(False, "--force",
                                            help="start over (your copy is kept: .bak, .bak2, ...)")):
    """Write practice/NN_name.py: the lesson with its exercise regions left for you to fill in."""
    lesson = lesson_or_die(lesson_id)
    try:
        path, regions, backup = practice.write_copy(lesson, force)
    except exercise.PracticeError as exc:
        die(str(exc))
    typer.echo(practice.welcome(lesson, path, regions, backup))


@app.command()
def solution(lesson_id: str = typer.Argument(..., metavar="ID"),
             force: bool = typer.Option(False, "--force", help="show it before you have passed")):
    """The reference code of the lesson's exercises, once `check ID --mine` has passed."""
    lesson = lesson_or_die(lesson_id)
    try:
        typer.echo(practice.solution(lesson, force))
    except exercise.PracticeError as exc:
        die(str(exc))


@app.command()
def why(lesson_id: Optional[str] = typer.Argument(None, metavar="[ID]")):
    """The last run's diagnosis again (with ID: that lesson's last run): the first call where its ranks'
    flight records diverged."""
    lines, rc = flightwatch.recall(lesson_or_die(lesson_id) if lesson_id else None)
    typer.echo("\n".join(fit(line) for line in lines))
    raise typer.Exit(rc)


@app.command()
def doctor():
    """What this machine can do: Python, MPI, torch, CuPy, GPUs, and what --device auto will pick."""
    from common.runner import doctor as doc
    raise typer.Exit(doc.main())


@app.command(context_settings=EXTRA)
def testbed(ctx: typer.Context, action: str = typer.Argument(..., metavar="up|down|run"),
            resolve: bool = typer.Option(False, "--resolve", help="node names resolve inside the nodes"),
            per_node: int = typer.Option(2, "--per-node", min=1, help="ranks per node"),
            shared_tmp: bool = typer.Option(False, "--shared-tmp", help="the nodes share this machine's /tmp "
                                            "(by default each has its own, as on a cluster)"),
            link_gbit: float = typer.Option(None, "--link-gbit", metavar="X",
                                            help="shape each node's link to X Gbit/s (tc's tbf)"),
            slurm: bool = typer.Option(False, "--slurm", help="run a Slurm cluster on the nodes (munge, "
                                       "slurmctld, a slurmd each); the command gets its SLURM_CONF")):
    """Two nodes on this machine (root): `testbed run -- bin/tutor run 05 -n 4` runs on a fresh bed and
    removes it; `testbed up` keeps one and prints its MPIEXEC line; `testbed down [TAG...]` removes them."""
    from common.runner import testbed as tb
    why = tb.missing(link_gbit if action != "down" else None, slurm and action != "down")
    if why:
        die(why)
    if (action, bool(ctx.args)) not in (("run", True), ("up", False), ("down", True), ("down", False)):
        die("testbed up | down [TAG...] | run -- COMMAND...")
    try:
        if action == "run":
            raise typer.Exit(tb.run(ctx.args, resolve, per_node, not shared_tmp, link_gbit, slurm))
        if action == "up":
            b = tb.up(resolve, per_node, keep=True, local_tmp=not shared_tmp, link_gbit=link_gbit, slurm=slurm)
            typer.echo(tb.describe(b))
            if slurm:  # the runner finds the allocation itself: no MPIEXEC
                typer.echo(f"export SLURM_CONF={b.slurm_conf}   # then: salloc -N 2 -n {2 * per_node} "
                           f"bin/tutor run 05 -n {2 * per_node}")
            else:
                typer.echo(f"export MPIEXEC='{b.mpiexec}'")
            raise typer.Exit(0)
    except (RuntimeError, OSError) as exc:
        if isinstance(exc, typer.Exit):  # typer's Exit is a RuntimeError
            raise
        die(f"testbed: {exc}")
    here = tb.beds()
    tags = ctx.args or [t for t, owner in here.items() if owner == "keep"]
    unknown = [t for t in tags if t not in here]
    if unknown:
        die(f"no test bed {unknown[0]} here (beds: {' '.join(here) or 'none'})")
    for tag in tags:
        tb.down(tag)
    typer.echo("removed: " + (" ".join(tags) or "nothing"))


@app.command()
def busbw(op: str = typer.Option("allreduce", help="allreduce, allgather, reducescatter, alltoall, "
                                                   "broadcast, reduce or sendrecv"),
          nbytes: int = typer.Option(..., "--bytes", help="message size in bytes (nccl-tests' size column)"),
          time_us: float = typer.Option(..., "--time-us", help="time per op in microseconds"),
          ranks: int = typer.Option(..., "--ranks", help="number of ranks")):
    """algbw and busbw from one nccl-tests line, with the arithmetic spelled out."""
    from common import bandwidth
    try:
        typer.echo(bandwidth.explain(op, nbytes, time_us, ranks))
    except ValueError as exc:
        die(str(exc))
