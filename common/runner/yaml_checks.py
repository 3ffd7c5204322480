"""The runner's checks: values picked from the results JSON by path, compared with the YAML's `expect`.

    - name: every rank holds the library's answer
      value: ranks[*].max_abs_err      # a path: dotted keys, [*] for every item, [2] for one
      le: 1.0e-6                       # equals | le | ge | lt | gt, with rtol / atol for equals
      when: np >= 2                    # optional: the check applies only when this is true
      none: -1                         # optional: the value that means "none", shown as that word

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


def select(doc, path, dims=None):
    """[(label, value, binds)] for a path; binds holds the scalar fields of the list items passed
    through, the label names them by the field that tells a list's items apart (`rank 1 count 7`;
    `runs[2]` where none does). `dims`, a list, gets one (noun, items) per [*] of the path: what the
    values stand for (('ranks', 4), ('counts', 5))."""
    found = [("", doc, {})]
    pos, last = 0, None
    while pos < len(path):
        m = _TOKEN.match(path, pos)
        if not m:
            raise expr.ExprError(f"bad value path {path!r} at {path[pos:]!r}")
        pos = m.end()
        key, index = m.group(1), m.group(2)
        if key is None and index is None:
            continue  # the "." between keys
        nxt, lists = [], [v for _, v, _ in found if isinstance(v, list)]
        then = _TOKEN.match(path, pos + 1) if path[pos:pos + 1] == "." else None
        checked = then.group(1) if then else None  # the field the check reads names nothing
        if index == "*" and dims is not None and lists:
            who = _identity(lists[0], checked)
            noun = last if who in NAMING or not who else who  # 7 figures, not 7 labels
            dims.append((_plural(noun or "value"), max(map(len, lists))))
        for label, value, binds in found:
            if key is not None:
                nxt.append((label, value.get(key, MISSING) if isinstance(value, dict) else MISSING, binds))
            elif not isinstance(value, list):
                nxt.append((label, MISSING, binds))
            else:
                picks = range(len(value)) if index == "*" else [int(index)]
                who = _identity(value, checked) if index == "*" else None
                for i in picks:
                    if not -len(value) <= i < len(value):
                        nxt.append((label, MISSING, binds))
                        continue
                    v = value[i]
                    here = f"{who} {v[who]}" if who else f"{last or ''}[{i}]"
                    nxt.append(((label + " " + here).strip() if index == "*" else label, v,
                                {**binds, **_scalars(v)}))
        last = key if key is not None else last
        found = nxt
    return found


NAMING = ("label", "name", "id", "key", "title")  # fields that name an item without saying what it is


def _identity(items, checked=None):
    """The first field (a whole number or a word) but `checked` whose value differs from item to item,
    so it names each: `rank` for ranks, `count` for the runs of lesson 05; None when no field does."""
    if not items or not all(isinstance(v, dict) for v in items):
        return None
    for key in (k for k in items[0] if k != checked):
        values = [v.get(key) for v in items]
        if all(isinstance(x, (int, str)) and not isinstance(x, bool) for x in values) and \
                len(set(values)) == len(values):
            return key
    return None


def _plural(noun):
    return noun if noun.endswith("s") else noun + "s"


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
    """[] when the check's `when` does not hold, else [one {name, ok, got, want}], with what the values
    stand for where the table needs it: `of` ('4 ranks x 5 counts'), `rule` (the YAML's closed form,
    when it wants a value per item) and `none` (the check's word for a sentinel value)."""
    if "when" in check and not expr.evaluate(check["when"], names_for(doc)):
        return []
    op = next(k for k in OPS if k in check)
    raw, none = check[op], check.get("none", MISSING)
    dims = []
    picked = select(doc, check["value"], dims)
    bad, wants, gots = [], [], []
    for label, got, binds in picked:
        want = expr.evaluate(raw, names_for(doc, binds)) if isinstance(raw, str) else raw
        shown = "missing" if got is MISSING else got
        wants.append(want)
        gots.append(shown)
        if not compare(got, op, want, check.get("rtol", 0.0), check.get("atol", 0.0)):
            bad.append((label, shown, want))
    ok = bool(picked) and not bad
    tol = "".join(f" ({k} {check[k]})" for k in ("rtol", "atol") if k in check)
    each = not isinstance(_summarise(wants), list) or len(wants) < 2  # one want for every item

    def said(label, shown, want):  # what was got in full; a want computed from a formula, to 6 digits
        value = named(shown, none, str)
        if not label and each and value != "none":
            return shown  # one value, as the lesson reported it
        return (f"{label}: " if label else "") + value + ("" if each else f", want {named(want, none)}")
    out = {"name": check["name"], "ok": ok, "got": [said(*b) for b in bad] if bad else _summarise(gots),
           "want": f"{OPS[op]} {_show(_summarise(wants))}{tol}"}
    if len(picked) > 1 and dims:
        out["of"] = " x ".join(f"{n} {noun}" for noun, n in dims)
    if not each and isinstance(raw, str):
        out["rule"] = f"{OPS[op]} {raw}{tol}"
    if none is not MISSING:
        out["none"] = none
    return [out]


def named(value, none=MISSING, show=None):
    """A value as a person reads it: the word `none` for the check's sentinel, else `show(value)`
    (floats to 6 significant digits by default)."""
    if none is not MISSING and not isinstance(value, bool) and value == none:
        return "none"
    return (show or _show)(value)


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
