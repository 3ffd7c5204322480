"""Mutation check of a lesson's exercise regions: do its checks kill small mechanical edits?

    .venv/bin/python tests/mutants.py 05 [--np 5 ...] [--api mpi4py] [--sample 25] [--seed 0] [--json PATH]

Each mutant is one edit inside one exercise region (common/runner/exercise.py), never outside one:
swap `//` and `%` or `+` and `-`, drop one term of a sum, +1 / -1 on an integer constant or an index,
flip a comparison (`<`/`<=`, `>`/`>=`, `==`/`!=`, `in`/`not in`, `is`/`is not`), `and`/`or`,
`min`/`max`, and put another local name of the same kind (called, indexed, or plain) or another
attribute read in the region in place of one. Each is staged as tests/test_wrong_answers.py stages a
wrong answer (a copy in a temp folder's lessons/, first on PYTHONPATH; the lesson file is never
edited) and graded as `bin/tutor check` grades a run: killed when a check fails, a rank crashes or
the run times out; survived when every check passes. A mutant that passes at the first NP and API
is graded again at the rest of `bin/tutor check`'s grid (every check NP, every API) unless --quick.
A survivor is an equivalent program or a mistake no check catches: the list at the end is for a
person to judge. Exit 1 when any survived.
"""
import argparse
import ast
import json
import os
import random
import re
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

from common.runner import catalog, exercise, lesson_run, preflight, verdict  # noqa: E402
from common.text import one_line  # noqa: E402

SWAPS = {ast.FloorDiv: ("//", "%"), ast.Mod: ("%", "//"), ast.Add: ("+", "-"), ast.Sub: ("-", "+")}
FLIPS = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
         ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.In: ("in", "not in"),
         ast.NotIn: ("not in", "in"), ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is")}
BOOLS = {ast.And: ("and", "or"), ast.Or: ("or", "and")}
ATOMS = (ast.Name, ast.Constant, ast.Attribute, ast.Call, ast.Subscript, ast.List, ast.Dict, ast.Set,
         ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.UnaryOp)
ARITH = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.MatMult)


@dataclass
class Mutant:
    id: str
    region: str
    line: int      # 1-based line of the lesson the edit starts on
    kind: str      # op, drop, const, index, compare, bool, minmax, name, attr
    start: int     # character offsets in the lesson's source of the text replaced
    end: int
    new: str       # what replaces it
    shown: str     # the edit in a few words: the expression around it, old -> new
    old: str = ""  # the text it replaces

    def apply(self, source):
        return source[:self.start] + self.new + source[self.end:]

    def said(self, width):
        """The edit in at most width characters: in its expression when that fits, else alone."""
        return one_line(self.shown if len(self.shown) <= width else f"{self.old} -> {self.new}", width)


def _wrapped(node, text):
    """text of node, in parentheses unless it binds at least as tightly as + and -."""
    tight = isinstance(node, ATOMS) or isinstance(node, ast.BinOp) and isinstance(node.op, ARITH)
    return text if tight else f"({text})"


class _Source:
    def __init__(self, text):
        self.text, self.starts, at = text, [], 0
        for line in text.splitlines(keepends=True):
            self.starts.append(at)
            at += len(line)
        self.lines = text.splitlines()

    def at(self, lineno, col):  # ast columns count UTF-8 bytes
        return self.starts[lineno - 1] + len(self.lines[lineno - 1].encode()[:col].decode(errors="ignore"))

    def span(self, node):
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno, node.end_col_offset)

    def seg(self, node):
        a, b = self.span(node)
        return self.text[a:b]


def _token(src, left, right, token):
    """(start, end) of the operator `token` alone between nodes left and right; None unless the gap
    holds only it, parentheses and spaces."""
    a, b = src.span(left)[1], src.span(right)[0]
    gap = src.text[a:b]
    if re.sub(r"[\s()\\]", "", gap) != token.replace(" ", ""):
        return None
    m = re.search(r"[^\s()\\].*[^\s()\\]|[^\s()\\]", gap, re.S)
    return a + m.start(), a + m.end()


def _kind(node, parents):
    """How a name or attribute is used where it stands: called, indexed, object (an attribute of it is
    read), text (met with a str) or plain."""
    up = parents.get(node)
    if isinstance(up, ast.Call) and up.func is node:
        return "called"
    if isinstance(up, ast.Subscript) and up.value is node or (
            isinstance(up, ast.Call) and isinstance(up.func, ast.Name) and up.func.id == "len"):
        return "indexed"
    if isinstance(up, ast.Attribute):
        return "object"
    if isinstance(up, (ast.Compare, ast.Assign)) and any(
            isinstance(c, ast.Constant) and isinstance(c.value, str) for c in ast.iter_child_nodes(up)):
        return "text"
    if isinstance(up, ast.Assign) and isinstance(up.value, (ast.List, ast.ListComp, ast.Dict, ast.DictComp)):
        return "indexed"
    return "plain"


RANK = {"plain": 0, "text": 1, "object": 2, "indexed": 3, "called": 4}


def _kinds(nodes, key, parents):
    kinds = {}
    for n in nodes:
        kind = _kind(n, parents)
        if RANK[kind] >= RANK[kinds.get(key(n), "plain")]:
            kinds[key(n)] = kind
    return kinds


def _locals(func, parents):
    """({name: kind}, visible(name, node)) of a function's parameters and assigned names: visible
    says whether the name is bound where node stands (from the line after its assignment; a
    comprehension's target inside that comprehension only, less its first iterable)."""
    lines, inside = {}, {}
    if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = func.args
        lines = {x.arg: func.lineno for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x}
    for n in ast.walk(func):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            up = parents.get(n)
            while isinstance(up, (ast.Tuple, ast.List, ast.Starred)):
                up = parents.get(up)
            if isinstance(up, ast.comprehension):  # its scope, less the first iterable (run outside it)
                comp = parents[up]
                scope = {id(x) for x in ast.walk(comp)} - {id(x) for x in ast.walk(comp.generators[0].iter)}
                inside.setdefault(n.id, set()).update(scope)
            else:
                lines[n.id] = min(lines.get(n.id, n.lineno + 1), n.lineno + 1)

    def visible(name, node):
        return lines.get(name, node.lineno + 1) <= node.lineno or id(node) in inside.get(name, ())

    names = [n for n in ast.walk(func) if isinstance(n, ast.Name) and (n.id in lines or n.id in inside)]
    kinds = _kinds(names, lambda n: n.id, parents)
    return {name: kinds.get(name, "plain") for name in {*lines, *inside}}, visible


def _skipped(node, parents):
    """Inside an f-string or an assert's message: text a person reads, never a value a check sees."""
    while node in parents:
        up = parents[node]
        if isinstance(up, ast.JoinedStr) or isinstance(up, ast.Assert) and up.msg is node:
            return True
        node = up
    return False


def mutations(source, regions):
    """Every mutant of the source's exercise regions, in source order (ids m001, m002, ...); each one
    parses and differs from the source as a program."""
    tree, src = ast.parse(source), _Source(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found = []
    for r in regions:
        inside = [n for n in ast.walk(tree) if hasattr(n, "end_lineno") and r.begin < n.lineno
                  and n.end_lineno < r.end and not _skipped(n, parents)]
        func = min((f for f in scopes if f.lineno < r.begin < f.end_lineno),
                   key=lambda f: f.end_lineno - f.lineno, default=tree)
        kinds, visible = _locals(func, parents)
        used = {n.id for n in inside if isinstance(n, ast.Name) and n.id in kinds}
        attrs = _kinds([n for n in inside if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)
                        and isinstance(n.value, ast.Name) and n.value.id in kinds], lambda n: n.attr, parents)

        def add(kind, node, a, b, new, context=None):
            context = context or node
            ca, cb = src.span(context)
            old = src.text[ca:cb]
            found.append(Mutant("", r.name, node.lineno, kind, a, b, new,
                                f"{old} -> {old[:a - ca]}{new}{old[b - ca:]}", src.text[a:b]))

        for n in inside:
            up = parents.get(n)
            around = up if isinstance(up, ast.expr) and up.lineno == up.end_lineno and len(src.seg(up)) <= 40 else n
            if isinstance(n, ast.BinOp) and type(n.op) in SWAPS:
                old, new = SWAPS[type(n.op)]
                where = _token(src, n.left, n.right, old)
                if where:
                    add("op", n, *where, new)
            if isinstance(n, ast.AugAssign) and type(n.op) in SWAPS:
                old, new = SWAPS[type(n.op)]
                where = _token(src, n.target, n.value, old + "=")
                if where:
                    add("op", n, *where, new + "=", n)
            if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Sub)):
                keep = [n.left, n.right] if isinstance(n.op, ast.Add) else [n.left]
                for term in keep:
                    add("drop", n, *src.span(n), _wrapped(term, src.seg(term)))
            if isinstance(n, ast.Constant) and type(n.value) is int:
                for v in (n.value + 1, n.value - 1):
                    add("const", n, *src.span(n), str(v) if v >= 0 else f"({v})", around)
            if isinstance(n, ast.Subscript):
                sl = n.slice
                ends = [sl.lower, sl.upper] if isinstance(sl, ast.Slice) else [sl]
                for e in ends:
                    if e is None or isinstance(e, (ast.Constant, ast.Tuple, ast.Slice)):
                        continue  # constants get their own +-1; tuples index many axes
                    for d in ("+ 1", "- 1"):
                        add("index", e, *src.span(e), f"{_wrapped(e, src.seg(e))} {d}", n)
            if isinstance(n, ast.Compare):
                for left, op, right in zip([n.left, *n.comparators], n.ops, n.comparators):
                    if type(op) in FLIPS:
                        old, new = FLIPS[type(op)]
                        where = _token(src, left, right, old)
                        if where:
                            add("compare", n, *where, new)
            if isinstance(n, ast.BoolOp) and len(n.values) == 2:
                old, new = BOOLS[type(n.op)]
                where = _token(src, n.values[0], n.values[1], old)
                if where:
                    add("bool", n, *where, new)
            if isinstance(n, ast.Name) and n.id in ("min", "max") and isinstance(up, ast.Call) and up.func is n:
                add("minmax", n, *src.span(n), "max" if n.id == "min" else "min", up)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in kinds:
                for other in sorted(used - {n.id}):
                    if kinds[other] == kinds[n.id] and visible(other, n):
                        add("name", n, *src.span(n), other, around)
            if (isinstance(n, ast.Attribute) and attrs.get(n.attr, "called") != "called"
                    and isinstance(n.value, ast.Name) and n.value.id in kinds):
                b = src.span(n)[1]
                for other in sorted(attrs):
                    if other != n.attr and attrs[other] == attrs[n.attr]:
                        add("attr", n, b - len(n.attr), b, other, around)
    return _distinct(source, regions, found)


def _body(text, region, delta=0):
    """The region's body in text (delta: lines the edit added), dedented: a program of its own."""
    lines = text.splitlines()[region.begin:region.end - 1 + delta]
    if any(line.strip() and not line.startswith(region.indent) for line in lines):
        raise ValueError(f"{region.name}: a line of its body is indented less than its markers")
    return "\n".join(line[len(region.indent):] for line in lines) + "\n"


def _distinct(source, regions, found):
    """The mutants that parse and change the program, one of each text, numbered. Only the region's
    body is parsed again (a whole lesson per mutant took seconds a lesson)."""
    seen, out, lines = set(), [], len(source.splitlines())
    original = {r.name: ast.dump(ast.parse(_body(source, r))) for r in regions}
    for m in sorted(found, key=lambda m: (m.start, m.end, m.kind, m.new)):
        text = m.apply(source)
        if text in seen:
            continue
        seen.add(text)
        r = next(r for r in regions if r.name == m.region)
        try:
            if ast.dump(ast.parse(_body(text, r, len(text.splitlines()) - lines))) == original[r.name]:
                continue
        except SyntaxError:
            continue
        m.id = f"m{len(out) + 1:03d}"
        out.append(m)
    return out


def sample(mutants, k, seed):
    """k mutants (all when k is None or >= their number), drawn by turns from each kind so that every
    kind is represented; returned in id order."""
    if k is None or k >= len(mutants):
        return list(mutants)
    rng, kinds = random.Random(seed), {}
    for m in mutants:
        kinds.setdefault(m.kind, []).append(m)
    queues = [kinds[kind] for kind in sorted(kinds)]
    for q in queues:
        rng.shuffle(q)
    rng.shuffle(queues)
    chosen = []
    while len(chosen) < k:
        for q in queues:
            if q and len(chosen) < k:
                chosen.append(q.pop())
    return sorted(chosen, key=lambda m: m.id)


def staged_case(source, region, mutant=None):
    """A test_wrong_answers case that replaces the region's body with the (mutated) body."""
    text = mutant.apply(source) if mutant else source
    return {"mistake": mutant.shown if mutant else "none", "region": region.name,
            "code": _body(text, region, len(text.splitlines()) - len(source.splitlines()))}


class Stopped(Exception):
    """A signal stopped a run: what was graded is still said and kept; exit with rc."""
    def __init__(self, rc):
        super().__init__(rc)
        self.rc = rc


def grade(lesson, source, region, mutant, nps, api, timeout):
    """{verdict: killed at the first NP (or (NP, API) pair) that does not pass (status: fail, crash or
    timeout), else survived; why; seconds}. The staged copy lives in a temp folder, removed after."""
    from test_wrong_answers import stage  # the wrong-answer suite's own staging
    folder, seconds = tempfile.mkdtemp(prefix="mutant-"), 0.0
    try:
        script, head = stage(lesson, staged_case(source, region, mutant), folder)
        os.environ["PYTHONPATH"] = os.pathsep.join([head, ROOT])  # the staged copy wins (as in the suite)
        for np in nps:
            np, api = np if isinstance(np, tuple) else (np, api)
            outcome, checks = lesson_run.run_lesson(lesson, np, api, "cpu", lesson.meta.get("args", []), echo=False,
                                                script=script, timeout=timeout)
            seconds += outcome.seconds
            if outcome.interrupted:
                raise Stopped(outcome.rc)
            if not verdict.ok(outcome, checks):
                status = verdict.status(outcome, checks)
                failed = [c["name"] for c in checks or [] if not c["ok"]]
                why = ("; ".join(failed) if failed else
                       f"every rank waited {outcome.stuck:.0f} s" if outcome.stuck else
                       f"not done in {timeout:.0f} s" if outcome.timed_out else
                       next(iter(outcome.errors.values()), f"exit {outcome.rc}"))
                return {"verdict": "killed", "status": status, "np": np, "api": api, "why": why,
                        "seconds": round(seconds, 2)}
        return {"verdict": "survived", "status": "pass", "np": None, "why": "every check passed",
                "seconds": round(seconds, 2)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _options(argv):
    p = argparse.ArgumentParser(prog="tests/mutants.py", description=__doc__.split("\n")[0])
    p.add_argument("lesson", help="a lesson id, e.g. 05")
    p.add_argument("--np", type=int, nargs="+", help="NPs to grade at (default: the largest of the YAML's check list)")
    p.add_argument("--api", default="mpi4py", choices=["mpi4py", "torch"])
    p.add_argument("--quick", action="store_true",
                   help="grade at the first NP and API only; by default a mutant that passes there is graded "
                        "again at every other NP and API of `bin/tutor check`, as a learner's check runs it")
    p.add_argument("--sample", type=int, help="grade K mutants, drawn by turns from each kind")
    p.add_argument("--seed", type=int, default=0, help="which K (default 0)")
    p.add_argument("--ids", help="grade only these mutants (comma-separated ids, e.g. m003,m017)")
    p.add_argument("--timeout", type=float, help="seconds per run (default: 5x the unmutated run, 20 s at least)")
    p.add_argument("--json", help="keep every graded mutant and its verdict here (written after each one)")
    p.add_argument("--list", action="store_true", help="list the mutants and grade none")
    return p.parse_args(argv)


def _chosen(a, lesson, every):
    """The mutants to grade and the NPs; ValueError (one line) on a bad request."""
    if a.sample is not None and a.sample < 1:
        raise ValueError(f"--sample {a.sample}: give a number of mutants, 1 or more")
    if a.timeout is not None and not 0 < a.timeout < 3600:
        raise ValueError(f"--timeout {a.timeout:g}: give seconds between 0 and 3600")
    nps = [preflight.parse_np(n, lesson) for n in a.np] if a.np else [max(lesson.meta["np"]["check"])]
    ceiling = preflight.np_ceiling()
    for n in nps:
        preflight.check_request(lesson, n, a.api, "cpu")
        if ceiling and n > ceiling:
            raise ValueError(f"--np {n}: more ranks than this machine runs ({ceiling})")
    if a.ids:
        ids = a.ids.split(",")
        unknown = sorted(set(ids) - {m.id for m in every})
        if unknown:
            raise ValueError(f"--ids: {lesson.name} has no mutant {', '.join(unknown)} (m001..m{len(every):03d})")
        return [m for m in every if m.id in ids], nps
    return sample(every, a.sample, a.seed), nps


def _keep(path, doc):
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".tmp", path)


def _said(rows, every):
    """The closing lines: the counts, then each survivor's line as it was and as the mutant has it."""
    alive = [r for r in rows if r["verdict"] == "survived"]
    how = {}
    for r in rows:
        if r["verdict"] == "killed":
            how[r["status"]] = how.get(r["status"], 0) + 1
    by = ", ".join(f"{n} {status}" for status, n in sorted(how.items()))
    yield (f"{len(rows) - len(alive)} killed{f' ({by})' if by else ''}, {len(alive)} survived "
           f"(of {len(every)} mutants, {len(rows)} graded)")
    for r in alive:
        yield f"survived {r['id']} {r['region']}:{r['line']} ({r['kind']}): an equivalent program, or a check missing?"
        yield "  - " + one_line(r["old_line"].strip(), 94)
        yield "  + " + one_line(r["new_line"].strip(), 94)


def main(argv=None):
    a = _options(argv)
    try:
        lesson = catalog.resolve(a.lesson, os.path.join(ROOT, "lessons"))
        with open(lesson.path) as f:
            source = f.read()
        regions = {r.name: r for r in exercise.find_regions(source, lesson.path)}
        every = mutations(source, list(regions.values()))
        chosen, nps = _chosen(a, lesson, every)
    except (ValueError, preflight.UsageError, exercise.PracticeError) as exc:  # CatalogError is a ValueError
        print(f"mutants: {exc}", file=sys.stderr)
        return 2
    if not regions:
        print(f"mutants: {lesson.name} has no exercise region", file=sys.stderr)
        return 2
    print(f"{lesson.name}: {len(every)} mutants in {len(regions)} region(s); grading {len(chosen)} "
          f"at np={','.join(map(str, nps))} api={a.api}")
    if a.list:
        for m in chosen:
            print(f"{m.id}  {one_line(f'{m.region}:{m.line}', 22):<22} {m.kind:<7} {m.said(66)}")
        return 0
    rows, rc = [], 0
    doc = {"lesson": lesson.name, "api": a.api, "np": nps, "sample": a.sample, "seed": a.seed,
           "generated": len(every), "chosen": len(chosen), "mutants": rows, "done": False}
    try:
        base = grade(lesson, source, next(iter(regions.values())), None, nps, a.api,
                     a.timeout or lesson.meta["timeout_s"])
        if base["verdict"] != "survived":
            print(f"mutants: the unmutated lesson does not pass ({base['status']}: {one_line(base['why'], 60)}); "
                  "nothing to grade", file=sys.stderr)
            return 1
        doc["timeout_s"] = timeout = a.timeout or min(lesson.meta["timeout_s"], max(20.0, 5 * base["seconds"]))
        print(f"unmutated: passes in {base['seconds']:.1f} s; each mutant's run ends at {timeout:.0f} s")
        for m in chosen:
            got = grade(lesson, source, regions[m.region], m, nps, a.api, timeout)
            rest = [] if a.quick or a.np else [(n, api) for api in lesson.meta["apis"]
                                               for n in lesson.meta["np"]["check"] if (n, api) != (nps[0], a.api)]
            if got["verdict"] == "survived" and rest:  # the rest of check's grid, torch's longer start-up too
                more = grade(lesson, source, regions[m.region], m, rest, a.api, 2 * timeout)
                got = {**more, "seconds": round(got["seconds"] + more["seconds"], 2)}
            rows.append({**asdict(m), **got, "old_line": source.splitlines()[m.line - 1],
                         "new_line": m.apply(source).splitlines()[m.line - 1]})
            at = "" if got.get("np") in (None, nps[0]) and got.get("api", a.api) == a.api else \
                f" np={got['np']} {got.get('api', a.api)}"
            why = f"{got['status']}{at}: {got['why']}"
            print(f"{m.id}  {one_line(f'{m.region}:{m.line}', 22):<22} {m.said(40):<40} {got['verdict']:<8} "
                  f"{one_line(why, 21) if got['verdict'] == 'killed' else ''}".rstrip(), flush=True)
            if a.json:
                _keep(a.json, doc)
        doc["done"] = True
    except Stopped as exc:
        print(f"stopped after {len(rows)} of {len(chosen)} mutants", flush=True)
        rc = exc.rc
    for line in _said(rows, every):
        print(line)
    if a.json:
        doc.update(graded=len(rows), killed=sum(r["verdict"] == "killed" for r in rows),
                   survived=sum(r["verdict"] == "survived" for r in rows))
        _keep(a.json, doc)
    return rc or (1 if any(r["verdict"] == "survived" for r in rows) else 0)


if __name__ == "__main__":
    sys.exit(main())
