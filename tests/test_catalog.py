"""Tier 1: finding lessons by id, and the YAML schema check (file and line on every problem);
plus the metadata test that keeps the real lessons and their YAML from drifting."""
import os
import re
import textwrap

import pytest

from common.runner import catalog
from conftest import FIXTURES, ROOT

GOOD = textwrap.dedent("""\
    title: t
    np: {default: 2, min: 1, check: [1, 2]}
    apis: [mpi4py]
    timeout_s: 10
    expect:
      - name: c
        value: ranks[*].x
        equals: np
    """)


@pytest.mark.parametrize("text", ["1", "01", "01_pass", "pass", "01_pass.py"])
def test_resolve_every_spelling(text):
    assert catalog.resolve(text, FIXTURES).name == "01_pass"


def test_unknown_lesson_lists_close_matches():
    with pytest.raises(catalog.CatalogError, match="no lesson 'pas'.*did you mean.*pass"):
        catalog.resolve("pas", FIXTURES)


def write(tmp_path, text):
    path = tmp_path / "01_x.yaml"
    path.write_text(text)
    return str(path)


def test_good_yaml_loads(tmp_path):
    assert catalog.load_yaml(write(tmp_path, GOOD))["np"]["check"] == [1, 2]


def test_names_the_lesson_reports_are_known(tmp_path):
    """Keys of its dicts (params, rank items), keys built by f-strings, and its flags' dests."""
    (tmp_path / "01_x.py").write_text(textwrap.dedent("""\
        def main(ctx, args, parser):
            parser.add_argument("--numpy-count", type=int)
            report.finish(ctx, {"steps": 3, **{f"has_{a}": 1 for a in "xy"}}, params={"count": 4})
        """))
    text = GOOD.replace("equals: np", "equals: count + steps + numpy_count + has_tree + rank")
    assert catalog.load_yaml(write(tmp_path, text))
    with pytest.raises(catalog.CatalogError, match="unknown name 'cout'.*did you mean 'count'"):
        catalog.load_yaml(write(tmp_path, GOOD.replace("equals: np", "equals: cout")))


def test_names_a_lessons_own_module_reports_are_known(tmp_path):
    """A results row built in lessons/<topic>/ (the page passes it on whole) names keys too; another
    folder's names do not count."""
    (tmp_path / "01_x.py").write_text("def main(ctx, rows):\n    report.finish(ctx, {'runs': rows})\n")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "step.py").write_text("def step():\n    return dict(busy_s=1.0)\n")
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "other.py").write_text("def other():\n    return dict(comm_s=1.0)\n")
    assert catalog.load_yaml(write(tmp_path, GOOD.replace("equals: np", "equals: busy_s")))
    with pytest.raises(catalog.CatalogError, match="unknown name 'comm_s'"):
        catalog.load_yaml(write(tmp_path, GOOD.replace("equals: np", "equals: comm_s")))


@pytest.mark.parametrize("change, message, line", [
    (("apis: [mpi4py]", "apis: [mpi4py"), "malformed YAML", 4),
    (("timeout_s: 10", "timeout_s: 10\nnpp: 3"), "unknown key 'npp'", 5),
    (("equals: np", "equals: __import__('os').getcwd()"), "not plain arithmetic", 8),
    (("equals: np", "equals: np.bit_length"), "not plain arithmetic", 8),
    (("equals: np", "between: [1, 2]"), "a check takes only", 8),
    (("np: {default: 2, min: 1, check: [1, 2]}", "np: 4"), "np must be", 2),
    (("title: t", "title: !!python/object/apply:os.getcwd []"), "malformed YAML", 1),
    # limits that would switch the watchdog off, or could never hold
    (("timeout_s: 10", "timeout_s: soon"), "timeout_s must be a number of seconds > 0", 4),
    (("timeout_s: 10", "timeout_s: 0"), "got 0", 4),
    (("timeout_s: 10", "timeout_s: -5"), "got -5", 4),
    (("timeout_s: 10", "timeout_s: .nan"), "got nan", 4),
    (("timeout_s: 10", "timeout_s: .inf"), "got inf", 4),
    (("timeout_s: 10", "timeout_s: true"), "got True", 4),
    (("{default: 2, min: 1, check: [1, 2]}", "{default: 4, min: 1, max: 2, check: [1, 2]}"),
     "np default 4 is outside the lesson's range 1..2", 2),
    (("{default: 2, min: 1, check: [1, 2]}", "{default: 2, min: 3, max: 2, check: [2]}"),
     "np max 2 is below its min 3", 2),
    (("{default: 2, min: 1, check: [1, 2]}", "{default: 2, min: 2, check: [1, 2]}"), "np check 1 is outside", 2),
    (("{default: 2, min: 1, check: [1, 2]}", "\n  default: 2\n  min: 1\n  max: 2\n  check: [1, 3]"),
     "np check 3 is outside", 6),                                     # block style: the check key's line
    (("apis: [mpi4py]", "apis: [[mpi4py]]"), "apis must list", 3),
    (("expect:\n  - name: c\n    value: ranks[*].x\n    equals: np", "expect: []"), "at least one check", 5),
    # expressions: the line of the key at fault, names checked when the YAML is loaded
    (("equals: np", "equals: nq * 2"), "unknown name 'nq' in 'nq * 2': did you mean 'np'?", 8),
    (("equals: np", "equals: np\n    when: device == 'gpu' and rnk > 0"), "unknown name 'rnk'", 9),
    (("equals: np", "equals: 1 if np > 0 else open('x')"), "not plain arithmetic", 8),  # untaken branch
    (("equals: np", "equals: np\n    rtol: -0.1"), "rtol must be a number >= 0", 9),
    (("value: ranks[*].x", "value: ranks[*.x"), "value must be a path", 7),
    (("- name: c", "- name: [c]"), "a check's name must be text", 6),
    (("timeout_s: 10", "timeout_s: 10\nhint: 3"), "hint must be text", 5),
    (("timeout_s: 10", "timeout_s: 10\ntakeaway: a line"), "takeaway must be a list of lines", 5),
    (("timeout_s: 10", "timeout_s: 10\ntakeaway: [\"" + "w" * 97 + "\"]"), "97 columns, over 96", 5),
    (("timeout_s: 10", "timeout_s: 10\nview: {args: --trace, says: x}"), "view must be", 5),
    (("timeout_s: 10", "timeout_s: 10\nview: {args: [--trace]}"), "view must be", 5),
])
def test_bad_yaml_names_file_and_line(tmp_path, change, message, line):
    path = write(tmp_path, GOOD.replace(*change))
    with pytest.raises(catalog.CatalogError) as err:
        catalog.load_yaml(path)
    assert message in str(err.value)
    assert re.search(rf"01_x\.yaml:{line}\b", str(err.value)), str(err.value)


# --- the real lessons: code and YAML agree -------------------------------------------------------
REAL = catalog.lessons(os.path.join(ROOT, "lessons"))


def test_there_are_lessons():
    assert any(l.id == "00" for l in REAL)


@pytest.mark.parametrize("lesson", REAL, ids=[l.name for l in REAL])
def test_lesson_metadata(lesson):
    assert os.path.exists(lesson.yaml_path), f"{lesson.name}.py has no {lesson.name}.yaml beside it"
    meta = catalog.load_yaml(lesson.yaml_path)   # every key known, expressions parse
    lo, hi = meta["np"]["min"], meta["np"].get("max")
    assert all(n >= lo and (hi is None or n <= hi) for n in meta["np"]["check"] + [meta["np"]["default"]])
    source = open(lesson.path).read()
    doc = source.split('"""')[1]
    assert f"make lesson-{lesson.id}" in doc, "the docstring shows the make line"
    assert f"lessons/{lesson.name}.py" in doc, "the docstring's mpiexec line names this very file"
    assert "report.finish(" in source and "bootstrap.start(" in source
    for marker in re.findall(r"# >>> exercise: (\S+)", source):
        assert f"# <<< exercise: {marker}" in source, f"exercise {marker} has no end marker"


@pytest.mark.parametrize("lesson", REAL, ids=[l.name for l in REAL])
def test_every_lesson_says_what_to_take_away_in_two_or_three_short_lines(lesson):
    """Printed after the verdict of a passing `bin/tutor run` (catalog.takeaway_lines), within 100 columns."""
    lesson.meta = catalog.load_yaml(lesson.yaml_path)
    said = lesson.meta.get("takeaway", [])
    assert 2 <= len(said) <= 3, f"{lesson.name}: takeaway has {len(said)} lines"
    printed = catalog.takeaway_lines(lesson)
    assert printed[0] == "take away:" and len(printed) == len(said) + 1
    assert max(len(line) for line in printed) <= 100, printed
    assert len(set(said)) == len(said)


def test_a_view_is_a_command_to_type_with_the_failed_runs_np_and_api(tmp_path):
    path = write(tmp_path, GOOD + 'view: {args: ["--trace", "--no-race"], says: the whiteboard}\n')
    lesson = catalog.Lesson("01", "01_x", path[:-5] + ".py", catalog.load_yaml(path))
    assert catalog.view_command(lesson, 3, "mpi4py", "cpu", mine=True) == (
        "bin/tutor run 01 --mine -n 3 -- --trace --no-race", "the whiteboard")
    assert catalog.view_command(lesson, 2, "torch", "gpu")[0] == (
        "bin/tutor run 01 -n 2 --api torch --device gpu -- --trace --no-race")
    lesson.meta.pop("view")
    assert catalog.view_command(lesson, 2, "mpi4py", "cpu") == ("bin/tutor run 01 -n 2", None)
    assert catalog.takeaway_lines(lesson) == []
