"""The checks table `bin/tutor run` prints after a run: every check's name whole (wrapped in its column,
never cut), and each value as what it stands for, within WIDTH columns; the results JSON keeps them all.

    check                                      got                   want
    -----------------------------------------  --------------------  ---------------------------  -
    every message goes to the right-hand       each of 4 ranks x 5   == (rank+1)%np if count > 0  ✓
      neighbour, rank+1 mod N (lowest            counts                else -1
      destination)
    every message goes to the right-hand       rank 1 count 7:       == (rank+1)%np if count > 0  ✗
      neighbour, rank+1 mod N (highest           none, want 2          else -1
      destination)

What a value stands for comes from the check (common/runner/yaml_checks.py): `of` (what a list's items
are), `rule` (the YAML's formula, when each item wants its own value) and `none` (a sentinel's word).
"""
import re

from common.runner.yaml_checks import MISSING, named
from common.text import WIDTH, alike, short, table


def checks_table(checks, width=WIDTH - 2):  # 2 spare: the mark (✓ is 3 bytes) is drawn wide by some terminals
    """The checks as a table within `width` columns where nothing is cut: a long name wraps in its
    column, and a value reads as what it stands for (got_cell, want_cell); the JSON keeps every value."""
    rows = [(c["name"], got_cell(c), want_cell(c), "✓" if c["ok"] else "✗") for c in checks]
    natural = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(("check", "got", "want"))]
    got_w, want_w = min(natural[1], 24), min(natural[2], 28)
    spare = max(0, width - 7 - natural[0] - got_w - want_w)  # 3 gaps of 2, the mark: short names leave room
    want_w += min(spare, natural[2] - want_w)
    got_w += min(width - 7 - natural[0] - got_w - want_w, natural[1] - got_w) if spare else 0
    values = [(_wrap(r[1], got_w), _wrap(r[2], want_w)) for r in rows]
    used = [max([len(h)] + [len(line) for v in values for line in v[i]]) for i, h in enumerate(("got", "want"))]
    name_w = max(12, min(natural[0], width - 7 - sum(used)))  # the names take what the values left
    lines = []
    for row, (got, want) in zip(rows, values):
        parts = [_wrap(row[0], name_w), got, want]
        lines += [tuple(p[i] if i < len(p) else "" for p in parts) + (row[3] if i == 0 else "",)
                  for i in range(max(map(len, parts)))]
    return table(["check", "got", "want", ""], lines, align=[False] * 4)


def _wrap(text, width):
    """Lines of at most `width`, continuations indented 2; a word longer than a line (a formula) is
    split after its operators, never cut."""
    pieces = []  # (text, joined to the piece before it without a space)
    for word in text.split():
        parts = [word] if len(word) <= width - 2 else [p for p in _AFTER_OP.findall(word) if p]
        parts = [p[i:i + width - 2] for p in parts for i in range(0, len(p), max(1, width - 2))]
        pieces += [(p, i > 0) for i, p in enumerate(parts)]
    lines, line = [], ""
    for piece, glued in pieces:
        gap = "" if glued or not line else " "
        if line and len(line) + len(gap) + len(piece) > width:
            lines.append(line)
            line = "  " + piece
        else:
            line += gap + piece
    return lines + [line]


_AFTER_OP = re.compile(r"[^*/+\-,)]*[*/+\-,)]?")


def got_cell(check):
    """What a check got, in words: the value itself when every item agrees ('none' for the check's
    sentinel); for a list that passed, its worst item against one bound ('max 0.0 of 4 ranks x 5
    counts') or what its items are ('each of 4 ranks x 5 counts'); for a failure, the items that
    failed, named by what they are ('rank 1 count 7: none, want 2'), as many as fit in a few lines."""
    got, none = check["got"], check.get("none", MISSING)
    if not check["ok"]:
        items = alike(got) if isinstance(got, list) else [named(got, none, str)]
        shown = []
        for item in items:
            if shown and len("; ".join(shown + [item])) > _FAILED_ROOM:
                break
            shown.append(item)
        more = len(items) - len(shown)
        return "; ".join(shown) + (f"; {more} more" if more else "")
    if not isinstance(got, list):
        return named(got, none)
    of = check.get("of") or f"{len(got)} values"
    op = str(check["want"]).split(" ", 1)[0]
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in got)
    if numbers and "rule" not in check and op in ("<=", "<", ">=", ">"):
        worst = max(got) if op in ("<=", "<") else min(got)
        return f"{'max' if op in ('<=', '<') else 'min'} {named(worst, none)} of {of}"
    return f"each of {of}"  # beside the want: 'each of 4 ranks x 5 counts  == itemsize*count'


_FAILED_ROOM = 90  # characters of a failure's items in the got column: about four lines


def want_cell(check):
    """What a check wants: one value for every item ('== none' for the sentinel), or, when each item
    wants its own, the YAML's formula (in its words where short, else said to be in the YAML)."""
    rule, want = check.get("rule"), str(check["want"])
    if rule:
        tol = _TOL.search(rule)
        return rule if len(rule) <= _RULE_ROOM else \
            f"{rule.split(' ', 1)[0]} the YAML's formula{tol[0] if tol else ''}"
    if "none" in check:
        op, _, value = want.partition(" ")
        tol = _TOL.search(value)
        if value[:tol.start() if tol else None] == named(check["none"]):
            return f"{op} none{tol[0] if tol else ''}"
    return short(want, _FAILED_ROOM)


_RULE_ROOM = 64  # a formula longer than two lines of its column is read in the YAML
_TOL = re.compile(r"( \((?:rtol|atol) [^)]*\))+$")
