"""Text for a terminal 100 columns wide, for the lessons and the runner alike: pure functions (no MPI,
no ctx, no files) that every printed line goes through.

    print(text.wrapped("a long sentence ..."))          # a paragraph, continuation lines indented 2
    print(text.fit(line))                               # one line as it is, or wrapped under itself
    print(text.table(["count", "us"], rows))            # numbers right-aligned, text left-aligned
    text.merge(texts)                                   # one text per rank -> lines tagged [rank r/N]
    text.brief(values), text.short(value, 40)           # a list shortened with a count
    text.ranks_of([0, 1, 2, 5])                         # 'ranks 0-2, 5'

Every line the kit prints fits WIDTH (tests/readable.py holds the runs to it); the JSON keeps values whole.
Where the terminal cannot print a mark (PYTHONIOENCODING=latin-1, a C locale), plain_marks(sys.stdout)
makes the stream write a look-alike ('✓' as '+') instead of failing; the runner (common/runner/__init__.py)
and every lesson (common/report.py) call it when they load.
"""
import codecs
import difflib
import os
import re
import textwrap
import unicodedata

WIDTH = 100  # columns: every printed line fits


def wrapped(text, indent="", hang=2, width=WIDTH):
    """text filled to `width`, each newline-separated paragraph on its own; continuation lines indented
    `hang` more than `indent`. Hyphenated words ("ping-pong", "all-reduce") stay whole."""
    return "\n".join(textwrap.fill(part, width, initial_indent=indent, subsequent_indent=indent + " " * hang,
                                   break_on_hyphens=False) for part in text.split("\n"))


def fit(line, width=WIDTH, indent="  "):
    """One line as it is where it fits `width`, else wrapped: the rest under its own indentation plus
    `indent`; words are not broken (a path longer than a line stays whole)."""
    if len(line) <= width:
        return line
    lead = line[:len(line) - len(line.lstrip())]
    return textwrap.fill(line.strip(), width, initial_indent=lead, subsequent_indent=lead + indent,
                         break_long_words=False, break_on_hyphens=False)


def one_line(text, width=WIDTH):
    """A library's or a launcher's own words as one printable line of at most `width` columns: NULs and
    other control characters out, spaces collapsed, the rest cut with '…'."""
    line = " ".join("".join(c if c.isprintable() else " " for c in str(text)).split())
    return line if len(line) <= width else line[:width - 1] + "…"


def path_shown(path):
    """`path` as a learner reads it: relative to where they stand, or absolute where that is shorter
    (a practice folder outside the repo is '/tmp/…/03.py', not '../../../tmp/…/03.py')."""
    rel, full = os.path.relpath(path), os.path.abspath(path)
    return rel if len(rel) <= len(full) else full


# ---- ranks: who said what

def spans(numbers, sep=", "):
    """'0-3', '0, 2, 5-7': the numbers sorted, consecutive runs joined."""
    numbers = sorted(numbers)
    out, start = [], None
    for i, n in enumerate(numbers):
        start = n if start is None else start
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            out.append(f"{start}" if start == n else f"{start}-{n}")
            start = None
    return sep.join(out)


def ranks_of(numbers):
    """'rank 2', 'ranks 0-3', 'ranks 0, 2, 5-7'."""
    return ("rank " if len(numbers) == 1 else "ranks ") + spans(numbers)


def rank_tag(ranks, n):
    """`[all ranks]`, `[rank 2/4]`, `[ranks 1-3/4]`, `[ranks 0,2/4]`: who said a line of merged output."""
    ranks = list(ranks)
    if n > 1 and len(ranks) == n:
        return "[all ranks]"
    return f"[{'rank' if len(ranks) == 1 else 'ranks'} {spans(ranks, ',')}/{n}]"


def by_message(per_rank):
    """[(ranks, message)]: ranks that said the same thing, in order of their first rank."""
    same = {}
    for rank in sorted(per_rank):
        same.setdefault(per_rank[rank], []).append(rank)
    return [(ranks, text) for text, ranks in sorted(same.items(), key=lambda kv: kv[1][0])]


def merge(texts):
    """One text per rank (rank order) -> the lines to print, each tagged with who said it.

    Lines every rank has, in the same order, print once as `[all ranks]`; between them, each rank's
    own lines print as a block under `[rank r/N]`, or `[ranks 1-3/N]` for ranks whose blocks are equal.
    """
    n = len(texts)
    lines = [str(t).splitlines() or [""] for t in texts]
    common = lines[0]
    for other in lines[1:]:  # a subsequence of every rank's lines, so it can be found in each
        blocks = difflib.SequenceMatcher(None, common, other, autojunk=False).get_matching_blocks()
        common = [line for i, _, size in blocks for line in common[i:i + size]]
    out, start = [], [0] * n
    for line in common + [None]:
        stop = [len(mine) if line is None else mine.index(line, at)
                for mine, at in zip(lines, start)]
        blocks = [tuple(mine[a:b]) for mine, a, b in zip(lines, start, stop)]  # ranks with equal ones: once
        out += [(ranks, said) for ranks, block in by_message(dict(enumerate(blocks))) for said in block]
        if line is not None:
            out.append((range(n), line))
            start = [b + 1 for b in stop]
    tags = [rank_tag(ranks, n) for ranks, _ in out]
    width = max(map(len, tags))
    return [f"{tag:<{width}} {line}".rstrip() for tag, (_, line) in zip(tags, out)]


_RANKED = re.compile(r"^rank (?P<rank>\d+): (?P<value>.*)$")


def alike(values):
    """Per-rank values ('rank 2: 0.5', as the checks report them) with ranks that got the same value
    said once ('ranks 0-3: 0.000548'); floats to 6 significant digits. Anything else as it is."""
    found = [_RANKED.match(str(v)) for v in values]
    if not values or not all(found):
        return [str(v) for v in values]
    return [f"{ranks_of(ranks)}: {_number(v)}" for ranks, v in by_message({int(m["rank"]): m["value"] for m in found})]


def _number(text):
    try:
        return text if float(text).is_integer() else _fmt(float(text))
    except ValueError:
        return text


# ---- lists and tables

def brief(values, limit=8):
    """A list of numbers for a lesson's sentence: whole up to `limit` items, else its count, first three
    and last (`[0, 1, 2, ..., 19] (20 values)`): the same list always prints the same shape."""
    values = values.tolist() if hasattr(values, "tolist") else list(values)
    if len(values) <= limit:
        return "[" + ", ".join(_fmt(v) for v in values) + "]"
    shown = ", ".join(_fmt(v) for v in values[:3])
    return f"[{shown}, ..., {_fmt(values[-1])}] ({len(values)} values)"


_LIST = re.compile(r"^(?P<head>[^\[]*)\[(?P<items>.*)\](?P<tail>[^\]]*)$")


def short(value, limit=60, sep=", "):
    """`value` for a table cell of at most `limit` characters: a list (or a want such as '== [0, 1, ...]')
    keeps the items that fit and says how many there are, e.g. '0, 1, 2, … (20 values)'; text ends in '…'."""
    if isinstance(value, list):
        items, head, tail = alike(value), "", ""
    else:
        text = str(value)
        m = _LIST.match(text) if len(text) > limit else None
        if not m or not m["items"].strip():
            return text if len(text) <= limit else text[:limit - 1] + "…"
        items, head, tail = _split(m["items"]), m["head"], m["tail"]
        head, tail = head + "[", "]" + tail
    if head:  # a list written in a want's text keeps its own commas
        sep = ", "
    whole = head + sep.join(items) + tail
    if len(whole) <= limit:
        return whole
    count = f"… ({len(items)} values){tail}"
    kept = []
    for item in items:
        if len(head + sep.join(kept + [item]) + sep + count) > limit:
            break
        kept.append(item)
    text = head + sep.join(kept) + (sep if kept else "") + count
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _split(inner):
    """The top-level items of a list's text: '[1, 2], 3' -> ['[1, 2]', '3']."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        if ch in "[({":
            depth += 1
        elif ch in "])}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(inner[start:i].strip())
            start = i + 1
    return items + [inner[start:].strip()]


def per_rank(values):
    """A table cell of per-rank numbers: all of them up to 4 ranks, else `lowest .. highest`."""
    values = list(values)
    return " ".join(map(str, values)) if len(values) <= 4 else f"{min(values)} .. {max(values)}"


def once(rows):
    """Rows (rank, values...) from every rank, in rank order: consecutive ranks with equal values make
    one row ('0-2'; 'all' when every rank's are equal)."""
    groups = []
    for r in rows:
        if groups and tuple(groups[-1][-1][1:]) == tuple(r[1:]):
            groups[-1].append(r)
        else:
            groups.append([r])
    if len(groups) == 1:
        return [("all",) + tuple(rows[0][1:])]
    return [(f"{g[0][0]}-{g[-1][0]}" if len(g) > 1 else g[0][0],) + tuple(g[0][1:]) for g in groups]


def table(headers, rows, align=None):
    """A plain-text table: numbers right-aligned, text left-aligned (align: a bool per column, True =
    right)."""
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = align or [all(isinstance(r[i], (int, float)) and not isinstance(r[i], bool)
                            for r in rows) if rows else False for i in range(len(headers))]

    def line(items):
        return "  ".join(s.rjust(w) if num else s.ljust(w)
                         for s, w, num in zip(items, widths, numeric)).rstrip()
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])


def _fmt(value):
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


# ---- marks a terminal cannot print

# what the kit's marks become on a terminal that cannot print them (PYTHONIOENCODING=latin-1, a
# C locale): look-alikes of one column where a table's alignment depends on it
ASCII = {"✓": "+", "✗": "x", "…": "...", "–": "-", "—": "-", "×": "x", "→": "->", "←": "<-", "≤": "<=",
         "≥": ">=", "≈": "~", "±": "+-", "·": ".", "α": "a", "β": "b", "γ": "g", "µ": "u", "μ": "u"}


def _look_alike(err):
    """A codec error handler: each character the stream cannot encode as its ASCII look-alike."""
    text = err.object[err.start:err.end]
    return "".join(ASCII.get(ch) or unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
                   or "?" for ch in text), err.end


codecs.register_error("tutor-ascii", _look_alike)


def plain_marks(*streams):
    """Make each text stream whose encoding is not a UTF write look-alikes (ASCII) for what it cannot
    encode instead of raising UnicodeEncodeError after a run has passed; a UTF stream is left alone."""
    for stream in streams:
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("_", "-")
        if encoding and not encoding.startswith("utf") and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="tutor-ascii")
            except (ValueError, OSError):  # closed, or not a TextIOWrapper after all: leave it as it is
                pass
