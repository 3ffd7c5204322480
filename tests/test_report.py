"""common/text.py's merge / rank_tag / brief / per_rank (what report.say and the lessons' tables print)
and tests/readable.problems (what a test holds every run's output to): pure functions, no MPI."""
import random
import re

import pytest

from common import text
from readable import columns, problems


def owned(lines, n):
    """Each rank's lines back from merged output: a line goes to every rank its tag names, and its
    text starts one column after the widest tag (merge pads the tags so the texts line up)."""
    tags = [re.match(r"\[(all ranks|ranks? ([\d,-]+)/\d+)\]", line) for line in lines]
    width = max(len(t.group(0)) for t in tags) + 1 if tags else 0
    back = [[] for _ in range(n)]
    for line, tag in zip(lines, tags):
        spans = [part.split("-") for part in tag.group(2).split(",")] if tag.group(2) else []
        ranks = [r for a, *b in spans for r in range(int(a), int((b or [a])[0]) + 1)] or range(n)
        for r in ranks:
            back[r].append(line[width:])
    return back


def test_text_alike_on_every_rank_prints_once():
    assert text.merge(["sum 6"] * 4) == ["[all ranks] sum 6"]
    assert text.merge(["a\nb"] * 3) == ["[all ranks] a", "[all ranks] b"]


def test_only_the_lines_that_differ_print_per_rank_and_equal_ones_are_grouped():
    texts = ["head\nx0\ntail", "head\nx1\ntail", "head\nx1\ntail", "head\nx3\ntail"]
    assert text.merge(texts) == [
        "[all ranks]   head",
        "[rank 0/4]    x0",
        "[ranks 1-2/4] x1",
        "[rank 3/4]    x3",
        "[all ranks]   tail",
    ]


def test_a_rank_with_more_to_say_keeps_its_lines_together_and_in_order():
    texts = ["gathered [0, 1, 2]\nfrom 3 ranks", "sent my piece", "sent my piece"]
    assert text.merge(texts) == ["[rank 0/3]    gathered [0, 1, 2]", "[rank 0/3]    from 3 ranks",
                                   "[ranks 1-2/3] sent my piece"]
    texts = ["blocked 1\n  announced: True", "blocked 2\n  announced: True"]
    assert text.merge(texts) == ["[rank 0/2]  blocked 1", "[rank 1/2]  blocked 2",
                                   "[all ranks]   announced: True"]


def test_one_rank_is_named_and_blank_lines_survive():
    assert text.merge(["only"]) == ["[rank 0/1] only"]
    assert text.merge(["a\n\nb", "a\n\nc"]) == ["[all ranks] a", "[all ranks]", "[rank 0/2]  b",
                                                  "[rank 1/2]  c"]
    assert text.merge(["", ""]) == ["[all ranks]"]


@pytest.mark.parametrize("ranks, n, tag", [
    ([0, 1, 2, 3], 4, "[all ranks]"), ([2], 4, "[rank 2/4]"), ([1, 2, 3], 4, "[ranks 1-3/4]"),
    ([0, 2], 4, "[ranks 0,2/4]"), ([0, 2, 3, 5], 8, "[ranks 0,2-3,5/8]"), ([0], 1, "[rank 0/1]")])
def test_rank_tags(ranks, n, tag):
    assert text.rank_tag(ranks, n) == tag


def test_the_runner_and_the_lessons_name_ranks_from_the_same_spans():
    assert text.ranks_of([2]) == "rank 2" and text.ranks_of([3, 0, 1, 2]) == "ranks 0-3"
    assert text.ranks_of([0, 2, 5, 6, 7]) == "ranks 0, 2, 5-7" and text.spans([0, 2, 3, 5], ",") == "0,2-3,5"
    assert text.by_message({2: "b", 0: "a", 1: "b"}) == [([0], "a"), ([1, 2], "b")]


def test_fit_wraps_a_long_line_under_itself_and_one_line_cuts():
    assert text.fit("short") == "short"
    long = "  " + " ".join(["word"] * 30) + " /a/path/" + "x" * 120
    lines = text.fit(long).splitlines()
    assert lines[0].startswith("  word") and all(line.startswith("    ") for line in lines[1:])
    assert lines[-1].strip() == "/a/path/" + "x" * 120  # a word longer than a line stays whole
    assert text.one_line("MPICH\0 Version:\t5.0\n  more") == "MPICH Version: 5.0 more"
    assert text.one_line("y" * 120) == "y" * 99 + "…"


def test_merge_loses_no_line_and_says_nothing_twice():
    """Random texts: each rank's lines come back whole and in order from the tags, and no line every
    rank says prints once per rank."""
    rng = random.Random(17)
    vocabulary = ["sum 6", "x = 1", "x = 2", "", "  indented: True", "ok", "peer 3"]
    for _ in range(300):
        n = rng.randint(1, 6)
        shared = [rng.choice(vocabulary) for _ in range(rng.randint(0, 4))]
        texts = []
        for r in range(n):
            mine = list(shared)
            for _ in range(rng.randint(0, 3)):
                mine.insert(rng.randint(0, len(mine)), rng.choice(vocabulary + [f"rank {r} only"]))
            texts.append("\n".join(mine))
        merged = text.merge(texts)
        assert owned(merged, n) == [t.splitlines() or [""] for t in texts], (texts, merged)
        assert len(merged) <= sum(len(t.splitlines() or [""]) for t in texts)
        if n > 1 and len(set(texts)) == 1:
            assert all(line.startswith("[all ranks]") for line in merged)


def test_brief_keeps_short_lists_whole_and_counts_long_ones():
    np = pytest.importorskip("numpy")
    assert text.brief(np.arange(3.0)) == "[0, 1, 2]"
    assert text.brief([0.5, 2]) == "[0.5, 2]"
    assert text.brief(range(20)) == "[0, 1, 2, ..., 19] (20 values)"
    assert text.brief(np.arange(12), 12) == "[" + ", ".join(map(str, range(12))) + "]"
    assert text.brief([]) == "[]"


# tests/readable.py

OLD_SAY = """== 2. all-reduce (SUM) of the rank ids: every rank should get N(N-1)/2
[rank 0/4] sum of ranks = 6   (formula 4*3/2 = 6)
[rank 1/4] sum of ranks = 6   (formula 4*3/2 = 6)
[rank 2/4] sum of ranks = 6   (formula 4*3/2 = 6)
[rank 3/4] sum of ranks = 6   (formula 4*3/2 = 6)
"""


def test_a_line_every_rank_prints_for_itself_is_a_problem_and_merge_fixes_it():
    found = problems(OLD_SAY, 4)
    assert len(found) == 1 and "all 4 ranks say 'sum of ranks = 6" in found[0], found
    merged = "\n".join(text.merge(["sum of ranks = 6   (formula 4*3/2 = 6)"] * 4))
    assert problems(merged, 4) == []
    groups = "[ranks 0-1/4] done\n[ranks 2-3/4] done\n"  # all ranks again, two groups at a time
    assert len(problems(groups, 4)) == 1


def test_untagged_lines_printed_by_every_rank_are_a_problem():
    said = "hello from a rank\n" * 3
    found = problems(said, 3)
    assert found == ["line 1: 'hello from a rank' printed 3 times (lines 1, 2, 3) by 3 ranks: say it once"]
    assert problems(said, 4) == []  # fewer than N copies is not N ranks speaking
    assert problems("[all ranks] x\n[all ranks] x\n", 2) != []  # the same shared line said twice


def test_what_may_repeat_does_not_count():
    table = "== 1. one\nname  n\n----  --\na     1\n\n== 1. one\nname  n\n----  --\nb     2\n"
    assert problems(table + "\n\n====\n", 2) == []  # headings, table headers, rules, blank lines
    assert problems("a     1\n" * 2, 2) != [] and problems("name  n\n" * 2, 2) != []  # rows do count
    assert problems("x\nx\nx\n", 1) == []                   # one rank: nothing is said per rank
    per_rank = "[rank 0/2] x = 1\n[rank 1/2] x = 2\n[rank 0/2] ----\n[rank 1/2] ----\n"
    assert problems(per_rank, 2) == []                      # differing lines, and a rule
    apart = "[rank 0/2] y\n[all ranks] x\n[rank 1/2] y\n"  # the same line said in another order
    assert problems(apart, 2) == []


def test_width_is_counted_in_terminal_columns():
    assert columns("abc") == 3 and columns("\x1b[1;31mred\x1b[0m") == 3
    assert columns("\tx") == 9 and columns("✓ …") == 3 and columns("漢字") == 4 and columns("é") == 1
    assert problems("x" * 100, 1) == []
    found = problems("ok\n" + "y" * 101, 1)
    assert found == [f"line 2: 101 columns (at most 100): {'y' * 57 + '...'!r}"]
    assert problems("漢" * 51, 1) != [] and problems("\x1b[1m" + "z" * 100 + "\x1b[0m", 1) == []


def test_every_problem_names_its_line():
    said = OLD_SAY + "w" * 120 + "\n" + "again\n" * 4
    found = problems(said, 4)
    assert [int(re.match(r"line (\d+):", p).group(1)) for p in found] == [2, 6, 7]


def test_per_rank_cells_shorten_past_four_ranks():
    assert text.per_rank([3, 1, 2, 0]) == "3 1 2 0"
    assert text.per_rank(range(7)) == "0 .. 6"
