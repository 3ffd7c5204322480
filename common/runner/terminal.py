"""Text for a terminal 100 columns wide: values shortened with a count, long lines wrapped, what
several ranks said alike said once ("ranks 0-3 failed: ..."), and check's progress, drawn only where
the terminal can draw it. Pure functions but progress(); the JSON keeps it all."""
import os
import re
import sys
import textwrap

from common.text import WIDTH, plain_marks  # every line the runner prints fits a terminal this wide

plain_marks(sys.stdout, sys.stderr)  # all bin/tutor prints: '+' for '✓' where the terminal cannot print it


_LIST = re.compile(r"^(?P<head>[^\[]*)\[(?P<items>.*)\](?P<tail>[^\]]*)$")


def short(value, limit=60, sep=", "):
    """`value` in at most `limit` characters: a list (or a want such as '== [0, 1, ...]') keeps the
    items that fit and says how many there are, e.g. '0, 1, 2, … (20 values)'; text ends in '…'."""
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


def path_shown(path):
    """`path` as a learner reads it: relative to where they stand, or absolute where that is shorter
    (a practice folder outside the repo is '/tmp/…/03.py', not '../../../tmp/…/03.py')."""
    rel, full = os.path.relpath(path), os.path.abspath(path)
    return rel if len(rel) <= len(full) else full


def fit(line, width=WIDTH, indent="  "):
    """One long line as several of at most `width` columns, the rest indented; words are not broken
    (a path longer than a line stays whole), and an already short line is returned as it is."""
    if len(line) <= width:
        return line
    lead = line[:len(line) - len(line.lstrip())]
    return textwrap.fill(line.strip(), width, initial_indent=lead, subsequent_indent=lead + indent,
                         break_long_words=False, break_on_hyphens=False)


def ranks_of(numbers):
    """'rank 2', 'ranks 0-3', 'ranks 0, 2, 5-7': consecutive runs joined."""
    numbers = sorted(numbers)
    spans, start = [], None
    for i, n in enumerate(numbers):
        start = n if start is None else start
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            spans.append(f"{start}" if start == n else f"{start}-{n}")
            start = None
    return ("rank " if len(numbers) == 1 else "ranks ") + ", ".join(spans)


def by_message(per_rank):
    """[(ranks, message)]: ranks that said the same thing, in order of their first rank."""
    same = {}
    for rank in sorted(per_rank):
        same.setdefault(per_rank[rank], []).append(rank)
    return [(ranks, text) for text, ranks in sorted(same.items(), key=lambda kv: kv[1][0])]


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
        return text if float(text).is_integer() else f"{float(text):.6g}"
    except ValueError:
        return text


def wrapped_table(table, headers, rows, width=WIDTH):
    """`table(headers, rows)` with its last column wrapped into lines that keep the whole row within
    `width` (continuation lines leave the other columns blank); every other column stays whole."""
    widths = [max([len(h)] + [len(str(r[i])) for r in rows]) for i, h in enumerate(headers[:-1])]
    room = max(20, width - sum(widths) - 2 * len(widths))
    out = []
    for row in rows:
        parts = textwrap.wrap(str(row[-1]), room, break_long_words=False, break_on_hyphens=False) or [""]
        out.append((*row[:-1], parts[0]))
        out += [("",) * (len(row) - 1) + (more,) for more in parts[1:]]
    return table(headers, out, align=[False] * len(headers))


def plain_terminal(stream):
    """True where a progress bar cannot be drawn: TERM=dumb (no cursor control), or fewer than 60
    columns (COLUMNS or the terminal's own); False for a file or pipe, where nothing is drawn anyway."""
    import shutil
    if not (hasattr(stream, "isatty") and stream.isatty()):
        return False
    return os.environ.get("TERM") == "dumb" or shutil.get_terminal_size((WIDTH, 24)).columns < 60


def progress(items, label, show, stream=None):
    """A `with` block over `items`: on a terminal that draws, click's bar sized to fit min(its columns,
    WIDTH); on a dumb or narrow one, one plain line per item ('checking 2/8: 05 np=2 mpi4py')."""
    import contextlib
    import shutil
    import sys

    import typer
    stream = stream or sys.stdout
    items = list(items)
    if plain_terminal(stream):
        def lines():
            for i, item in enumerate(items, 1):
                print(fit(f"{label} {i}/{len(items)}: {show(item)}", shutil.get_terminal_size((WIDTH, 24)).columns),
                      file=stream, flush=True)
                yield item
        return contextlib.nullcontext(lines())
    cols = min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns)
    clutter = len(label) + 2 * len(str(len(items))) + max([len(show(i)) for i in items] + [0]) + 12
    return typer.progressbar(items, label=label, show_pos=True, width=max(4, min(36, cols - 1 - clutter)),
                             item_show_func=lambda p: p and show(p), file=stream)
