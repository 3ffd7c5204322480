"""Tier 1: picking values from a results JSON by path and comparing them with the YAML's wants."""
from common.runner.yaml_checks import MISSING, run_checks, select

DOC = {"lesson": "x", "np": 3, "api": "mpi4py", "device": "cpu", "transport": "mpi",
       "params": {"count": 10},
       "ranks": [{"rank": 0, "err": 0.0, "steps": 4}, {"rank": 1, "err": 1e-7, "steps": 4},
                 {"rank": 2, "err": 0.5, "steps": 4}],
       "summary": {"ratio": 0.95, "nested": {"deep": [1, 2, 3]}}}


def test_select_paths():
    assert [v for _, v, _ in select(DOC, "ranks[*].steps")] == [4, 4, 4]
    assert [v for _, v, _ in select(DOC, "summary.nested.deep[-1]")] == [3]
    assert [v for _, v, _ in select(DOC, "params.count")] == [10]
    assert [v for _, v, _ in select(DOC, "summary.absent")] == [MISSING]
    assert [label for label, _, _ in select(DOC, "ranks[*].err")] == ["rank 0", "rank 1", "rank 2"]


def check(**kw):
    return run_checks([{"name": "c", **kw}], DOC)[0]


def test_le_fails_and_names_the_bad_rank():
    result = check(value="ranks[*].err", le=1e-6)
    assert not result["ok"]
    assert result["got"] == ["rank 2: 0.5"]


def test_expression_in_np_and_params():
    assert check(value="ranks[*].steps", equals="2*(np-1)")["ok"]
    assert not check(value="ranks[*].steps", equals="2*np")["ok"]
    assert check(value="params.count", equals="count")["ok"]


def test_per_rank_expression():
    assert check(value="ranks[*].rank", equals="rank")["ok"]
    assert not check(value="ranks[*].rank", equals="rank + 1")["ok"]


def test_tolerances():
    assert check(value="summary.ratio", equals=1.0, rtol=0.1)["ok"]
    assert not check(value="summary.ratio", equals=1.0, rtol=0.01)["ok"]
    assert check(value="summary.ratio", equals=1.0, atol=0.06)["ok"]


def test_missing_value_fails():
    result = check(value="summary.nope", ge=0)
    assert not result["ok"] and result["got"] == ["missing"]


def test_when_skips_checks_that_do_not_apply():
    assert run_checks([{"name": "torch only", "value": "summary.nope", "ge": 0,
                        "when": "api == 'torch'"}], DOC) == []
    assert len(run_checks([{"name": "np 3", "value": "summary.ratio", "ge": 0, "when": "np == 3"}], DOC)) == 1


def test_no_items_is_a_failure_not_a_pass():
    empty = {**DOC, "ranks": []}
    assert not run_checks([{"name": "c", "value": "ranks[*].err", "le": 1}], empty)[0]["ok"]


def test_a_check_whose_expression_cannot_be_evaluated_fails_instead_of_crashing():
    result = run_checks([{"name": "c", "value": "summary.ratio", "ge": 0, "when": "race == 1"}], DOC)[0]
    assert not result["ok"] and "unknown name 'race'" in result["got"]


def test_wanted_values_read_well():
    assert check(value="ranks[*].rank", equals="rank")["want"] == "== [0, 1, 2]"
    assert check(value="summary.ratio", le="0.1 + 0.2")["want"] == "<= 0.3"


NESTED = {"np": 2, "params": {"count": 99, "itemsize": 4},
          "ranks": [{"rank": r, "runs": [{"rank": r, "count": c, "sent": 4 * c + r} for c in (0, 5, 7)]}
                    for r in range(2)]}


def test_nested_items_bind_their_fields_and_inner_items_win():
    picked = select(NESTED, "ranks[*].runs[*].sent")
    assert [label for label, _, _ in picked][:4] == ["rank 0 count 0", "rank 0 count 5", "rank 0 count 7",
                                                     "rank 1 count 0"]  # `count` tells the runs apart
    assert [b["count"] for _, _, b in picked] == [0, 5, 7, 0, 5, 7]  # the run's count, not params' 99
    good = run_checks([{"name": "c", "value": "ranks[*].runs[*].sent", "equals": "itemsize*count + rank"}],
                      NESTED)[0]
    assert good["ok"], good
    bad = run_checks([{"name": "c", "value": "ranks[*].runs[*].sent", "equals": "itemsize*count"}], NESTED)[0]
    assert not bad["ok"] and bad["got"] == ["rank 1 count 0: 1, want 0", "rank 1 count 5: 21, want 20",
                                            "rank 1 count 7: 29, want 28"]  # each item's own want beside it
    assert bad["of"] == "2 ranks x 3 counts" and bad["rule"] == "== itemsize*count"


def test_items_no_field_tells_apart_are_named_by_their_list_and_index():
    doc = {"np": 1, "summary": {"step": [{"kind": "a", "t": 1}, {"kind": "a", "t": 2}]}}
    dims = []
    assert [label for label, _, _ in select(doc, "summary.step[*].t", dims)] == ["step[0]", "step[1]"]
    assert dims == [("steps", 2)]
    plain = {"np": 1, "summary": {"sizes": [3, 4]}}
    assert [label for label, _, _ in select(plain, "summary.sizes[*]")] == ["sizes[0]", "sizes[1]"]


def test_a_sentinel_reads_as_its_word_and_one_want_for_all_is_not_repeated():
    runs = [[{"count": c, "dest": -1 if r == 1 or not c else (r + 1) % 3} for c in (0, 7)] for r in range(3)]
    doc = {"np": 3, "params": {}, "ranks": [{"rank": r, "runs": runs[r]} for r in range(3)]}
    per_item = run_checks([{"name": "c", "value": "ranks[*].runs[*].dest", "equals": "(rank+1)%np if count > 0 else -1",
                            "none": -1}], doc)[0]
    assert per_item["got"] == ["rank 1 count 7: none, want 2"] and per_item["none"] == -1, per_item
    assert per_item["want"] == "== [-1, 1, -1, 2, -1, 0]"  # the JSON keeps every wanted value
    one = run_checks([{"name": "c", "value": "ranks[*].runs[*].dest", "ge": 0, "none": -1}], doc)[0]
    assert one["got"][:2] == ["rank 0 count 0: none", "rank 1 count 0: none"] and "rule" not in one, one
    bare = run_checks([{"name": "c", "value": "ranks[1].runs[0].dest", "ge": 0}], doc)[0]
    assert bare["got"] == [-1] and "of" not in bare  # no label, no word: the value as it was
