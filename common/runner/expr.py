"""Plain arithmetic from a lesson's YAML, evaluated safely: parsed with `ast`, never `eval()`.

Allowed: numbers, strings, True/False, the names given (np, rank, the lesson's params, api ...),
+ - * / // % **, comparisons, and/or/not, a if c else b, and the functions min max abs sqrt log2 ceil floor.
Anything else (attributes, subscripts, lambdas, other calls, imports) is refused with ExprError.
"""
import ast
import math
import operator

BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
          ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
          ast.Pow: operator.pow}
UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge}
FUNCTIONS = {"min": min, "max": max, "abs": abs, "sqrt": math.sqrt, "log2": math.log2,
             "ceil": math.ceil, "floor": math.floor}


class ExprError(ValueError):
    pass


def evaluate(text, names):
    """The value of expression `text` with `names` bound; ExprError if it is not plain arithmetic."""
    try:
        tree = ast.parse(str(text).strip(), mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"cannot parse {text!r}: {exc.msg}") from None
    return _eval(tree.body, names, text)


def names_used(text):
    """The names expression `text` reads, every branch walked (nothing is evaluated); ExprError if any
    part of it is not plain arithmetic. The YAML loader calls it, so a bad branch fails on load."""
    try:
        tree = ast.parse(str(text).strip(), mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"cannot parse {text!r}: {exc.msg}") from None
    found = set()
    todo = [tree.body]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS and not node.keywords):
                raise ExprError(f"not plain arithmetic: {type(node).__name__} in {text!r}")
            todo += node.args
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, float, str, bool)):
                raise ExprError(f"not plain arithmetic: {type(node).__name__} in {text!r}")
        elif isinstance(node, ALLOWED):
            todo += [c for c in ast.iter_child_nodes(node) if not isinstance(c, OPERATORS)]
            if isinstance(node, ast.BinOp) and type(node.op) not in BINARY or \
                    isinstance(node, ast.UnaryOp) and type(node.op) not in UNARY or \
                    isinstance(node, ast.Compare) and any(type(op) not in COMPARE for op in node.ops):
                raise ExprError(f"not plain arithmetic: {type(node).__name__} in {text!r}")
        else:
            raise ExprError(f"not plain arithmetic: {type(node).__name__} in {text!r}")
    return found


ALLOWED = (ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.IfExp)
OPERATORS = (ast.operator, ast.unaryop, ast.cmpop, ast.boolop)


def _eval(node, names, text):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in names:
            return names[node.id]
        raise ExprError(f"unknown name {node.id!r} in {text!r} (known: {', '.join(sorted(names))})")
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _eval(node.left, names, text), _eval(node.right, names, text)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ExprError(f"exponent too large in {text!r}")
        return BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](_eval(node.operand, names, text))
    if isinstance(node, ast.Compare) and all(type(op) in COMPARE for op in node.ops):
        left = _eval(node.left, names, text)
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, names, text)
            if not COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.BoolOp):
        values = (_eval(v, names, text) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.IfExp):
        branch = node.body if _eval(node.test, names, text) else node.orelse
        return _eval(branch, names, text)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS
            and not node.keywords):
        return FUNCTIONS[node.func.id](*(_eval(a, names, text) for a in node.args))
    raise ExprError(f"not plain arithmetic: {type(node).__name__} in {text!r}")
