"""Tier 1: the YAML expression evaluator computes plain arithmetic and refuses everything else."""
import pytest

from common.runner.expr import ExprError, evaluate


@pytest.mark.parametrize("text, names, want", [
    ("2*(np-1)", {"np": 4}, 6),
    ("np*(np-1)//2", {"np": 5}, 10),
    ("0 if rank < (np+1)//2 else 1", {"np": 3, "rank": 2}, 1),
    ("max(count // np, 1) * 4", {"np": 4, "count": 7}, 4),
    ("2**10 + -3 % 2", {}, 1025),
    ("1 <= np <= 4 and api == 'torch'", {"np": 2, "api": "torch"}, True),
    ("sqrt(16) + abs(-2) + ceil(0.5) + floor(1.5) + log2(8)", {}, 11.0),
    ("not (np > 2)", {"np": 2}, True),
])
def test_arithmetic(text, names, want):
    assert evaluate(text, names) == want


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')",      # a call to something not in the allowed list
    "np.__class__",                         # attribute access
    "().__class__.__bases__[0]",            # the classic sandbox escape
    "[x for x in range(3)]",                # comprehensions
    "lambda: 1",
    "params['count']",                      # subscripts
    "open('/etc/passwd')",
    "2 ** 1000000",                         # an exponent that would burn the CPU
    "min(1, key=abs)",                      # keyword arguments
])
def test_refuses_what_is_not_arithmetic(text):
    with pytest.raises(ExprError):
        evaluate(text, {"np": 2})


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ExprError, match="unknown name 'nq'.*np"):
        evaluate("nq + 1", {"np": 2})


def test_syntax_error_is_an_expr_error():
    with pytest.raises(ExprError, match="cannot parse"):
        evaluate("2 *", {})


def test_names_used_walks_every_branch_without_evaluating():
    from common.runner.expr import names_used
    assert names_used("count if rank < np else max(a, 2) and not b") == {"count", "rank", "np", "a", "b"}
    for text in ("1 if np > 0 else open('x')", "np or ().__class__", "0 and [1][0]", "2 ** np.real"):
        with pytest.raises(ExprError, match="not plain arithmetic"):
            names_used(text)  # evaluate() would never reach the bad branch of these
