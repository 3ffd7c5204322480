"""Is a run's output readable by a person? `problems(text, nranks)` lists what is not, one line each.

The rules, exactly:

1. Width: every line is at most 100 columns, counted as a terminal shows it: colour escapes take
   none, a tab runs to the next multiple of 8, East Asian wide characters take two, combining marks
   none.
2. Said once (only when nranks >= 2):
   a. per-rank tags: inside one block of consecutive lines tagged per rank (`[rank r/N]`,
      `[ranks 1-3/N]`), a text that every one of the N ranks says, on two or more lines, should
      have been one `[all ranks]` line (an `[all ranks]` line ends a block: what ranks say in a
      different order around a shared line may differ in place, not in content);
   b. untagged lines: a line with a letter or digit in it that appears nranks times or more,
      character for character, is what N ranks printing the same thing on their own looks like
      (an `[all ranks]` line counts as untagged: the same line said again is the same repetition).
   Not counted: blank lines; lines without a letter or digit (table rules `----  ---`, `=====`);
   section headings (`== ...`, which report.section prints from rank 0 alone) and table headers (the
   line right above a rule), which come back legitimately in other sections; and untagged lines
   that appear fewer than nranks times. Any other untagged line said twice at NP 2 is flagged: say
   it once, or say what differs.
"""
import re
import unicodedata

WIDTH = 100
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
TAG = re.compile(r"^\[(?:rank (?P<one>\d+)|ranks (?P<many>[\d,-]+))/(?P<n>\d+)\]\s?(?P<body>.*)$")


def columns(line):
    """The columns a terminal gives the line."""
    width = 0
    for ch in ANSI.sub("", line):
        if ch == "\t":
            width += 8 - width % 8
        elif unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
            continue
        else:
            width += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return width


def _ranks(spec):
    """`0,2-3` -> {0, 2, 3}."""
    out = set()
    for part in spec.split(","):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def _counted(text):
    return any(ch.isalnum() for ch in text)


def _rule(line):
    """A table's rule: dashes, and the spaces between its columns."""
    return "-" in line and set(line.strip()) <= {"-", " "}


def _show(line, width=60):
    line = line.strip()
    return repr(line if len(line) <= width else line[:width - 3] + "...")


def problems(text, nranks):
    """Human-readable problems of `text`, printed by a run of `nranks` ranks: [] when it reads well."""
    lines = [ANSI.sub("", line).rstrip() for line in text.splitlines()]
    found = [(i, f"line {i}: {columns(line)} columns (at most {WIDTH}): {_show(line)}")
             for i, line in enumerate(lines, 1) if columns(line) > WIDTH]
    if nranks < 2:
        return [problem for _, problem in found]

    per_rank, untagged, block = {}, {}, 0  # per_rank: (block, text) -> [(line, ranks, N)]
    for i, (line, below) in enumerate(zip(lines, lines[1:] + [""]), 1):
        tag = TAG.match(line)
        if tag is None:
            block += 1  # a block of per-rank lines ends at any other line
            heading = line.startswith("== ") or (_counted(line) and _rule(below))
            if _counted(line) and not heading:
                untagged.setdefault(line.strip(), []).append(i)
        elif _counted(tag["body"]):
            ranks = {int(tag["one"])} if tag["one"] is not None else _ranks(tag["many"])
            per_rank.setdefault((block, tag["body"].strip()), []).append((i, ranks, int(tag["n"])))

    for (_, body), seen in per_rank.items():
        n = seen[0][2]
        if len(seen) >= 2 and n >= 2 and set().union(*(r for _, r, _ in seen)) >= set(range(n)):
            found.append((seen[0][0], f"line {seen[0][0]}: all {n} ranks say {_show(body)}, each on "
                                      f"a line of its own ({len(seen)} lines): say it once, as [all ranks]"))
    for line, where in untagged.items():
        if len(where) >= nranks:
            at = ", ".join(map(str, where[:6])) + (", ..." if len(where) > 6 else "")
            found.append((where[0], f"line {where[0]}: {_show(line)} printed {len(where)} times "
                                    f"(lines {at}) by {nranks} ranks: say it once"))
    return [problem for _, problem in sorted(found)]
