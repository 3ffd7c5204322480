"""The runner's checks: values picked from the results JSON by path, compared with the YAML's `expect`.

    - name: every rank holds the library's answer
      value: ranks[*].max_abs_err      # a path: dotted keys, [*] for every item, [2] for one
      le: 1.0e-6                       # equals | le | ge | lt | gt, with rtol / atol for equals
      when: np >= 2                    # optional: the check applies only when this is true

Wanted values that are strings are expressions (common.runner.expr) in np, api, device, transport, the
lesson's params, and the scalar fields of every list item the path went through: in
`ranks[*].runs[*].bytes_sent` the expression sees the rank item's `rank` and the run item's `count`
(inner items win). So expectations are closed forms independent of the lesson's arithmetic.
"""
import math
import re

from common.runner import expr

OPS = {"equals": "==", "le": "<=", "ge": ">=", "lt": "<", "gt": ">"}
_TOKEN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)|\[(\*|-?\d+)\]|\.")
MISSING = object()


def select(doc, path):
    """[(label, value, binds)] for a path; binds holds the scalar fields of the list items passed
    through, the label names them (`rank 1`, `rank 1 [2]`)."""
    found = [("", doc, {})]
    pos = 0
    while pos < len(path):
        m = _TOKEN.match(path, pos)
        if not m:
            raise expr.ExprError(f"bad value path {path!r} at {path[pos:]!r}")
        pos = m.end()
        key, index = m.group(1), m.group(2)
        if key is None and index is None:
            continue  # the "." between keys
        nxt = []
        for label, value, binds in found:
            if key is not None:
                nxt.append((label, value.get(key, MISSING) if isinstance(value, dict) else MISSING, binds))
            elif not isinstance(value, list):
                nxt.append((label, MISSING, binds))
            else:
                picks = range(len(value)) if index == "*" else [int(index)]
                for i in picks:
                    if not -len(value) <= i < len(value):
                        nxt.append((label, MISSING, binds))
                        continue
                    v = value[i]
                    here = f"rank {v['rank']}" if isinstance(v, dict) and "rank" in v and not label else f"[{i}]"
                    nxt.append(((label + " " + here).strip() if index == "*" else label, v,
                                {**binds, **_scalars(v)}))
        found = nxt
    return found


def _scalars(item):
    if not isinstance(item, dict):
        return {}
    return {k: v for k, v in item.items() if isinstance(v, (int, float, str, bool))}


def names_for(doc, binds=None):
    names = {"np": doc.get("np"), "api": doc.get("api"), "device": doc.get("device"),
             "transport": doc.get("transport")}
    names.update(doc.get("params") or {})
    names.update(binds or {})
    return names


def compare(got, op, want, rtol=0.0, atol=0.0):
    if got is MISSING or got is None:
        return False
    if op == "equals":
        if isinstance(want, (int, float)) and not isinstance(want, bool) and isinstance(got, (int, float)):
            if rtol or atol:
                return math.isclose(got, want, rel_tol=rtol, abs_tol=atol)
        return got == want
    try:
        return {"le": got <= want, "ge": got >= want, "lt": got < want, "gt": got > want}[op]
    except TypeError:
        return False


def run_checks(expect, doc):
    """[{name, ok, got, want}] for every check that applies to this results document."""
    out = []
    for check in expect:
        try:
            out += _one_check(check, doc)
        except (expr.ExprError, ArithmeticError, TypeError) as exc:  # a YAML bug: fail, don't crash
            out.append({"name": check["name"], "ok": False, "got": f"error: {exc}", "want": "a valid check"})
    return out


def _one_check(check, doc):
    """[] when the check's `when` does not hold, else [one {name, ok, got, want}]."""
    if "when" in check and not expr.evaluate(check["when"], names_for(doc)):
        return []
    op = next(k for k in OPS if k in check)
    raw = check[op]
    picked = select(doc, check["value"])
    bad, wants, gots = [], [], []
    for label, got, binds in picked:
        want = expr.evaluate(raw, names_for(doc, binds)) if isinstance(raw, str) else raw
        shown = "missing" if got is MISSING else got
        wants.append(want)
        gots.append(shown)
        if not compare(got, op, want, check.get("rtol", 0.0), check.get("atol", 0.0)):
            bad.append(f"{label}: {shown}" if label else shown)
    ok = bool(picked) and not bad
    tol = "".join(f" ({k} {check[k]})" for k in ("rtol", "atol") if k in check)
    return [{"name": check["name"], "ok": ok, "got": bad if bad else _summarise(gots),
             "want": f"{OPS[op]} {_show(_summarise(wants))}{tol}"}]


def _show(value):
    """Floats to 6 significant digits, so a computed bound reads 3.6e-07, not 3.5999999999999994e-07."""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def _summarise(values):
    """One value when every item agrees, else the list."""
    if not values:
        return "nothing"
    if all(v == values[0] for v in values):
        return values[0]
    return values
