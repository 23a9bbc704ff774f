r"""What the `math` environment adds around math-verify, so wrong answers stop matching and right
ones in common forms stop scoring 0 (issue 27). The text helpers are plain Python; `install_guards`
and `too_large` need sympy and run only in the worker process.

Text, before math-verify parses it (answer and reference alike):
- digit groups `1\,000` and `1{,}000` are `1000`; `√`, `∛`, `∞`, `π`, `≤`, `≥`, `≠`, `×`, `·` and
  the Unicode minus are their LaTeX; a repeating decimal `0.\overline{3}` is the fraction `\frac{1}{3}`;
  in an answer with no math delimiters, a run holding a root (`√2`, `3√2/2`) is put between `$...$`
  (`The answer is √2.` reads as `\boxed{√2}` does, not as 2).

Multiple choice: a reference that is one letter A-J (`C`, `(C)`, `\text{C}`) is compared with the
letter the answer gives last: `\boxed{C}`, `Answer: C`, `**Answer: (C)**`, `the answer is C`, or an
answer that is only the letter. Nothing else is read as a choice.

Comparisons, wrapped inside math-verify (`install_guards`), recursively (inside sets, tuples,
intervals, relations):
- numbers are equal only when math-verify finds them equal (six decimal places) *and* they agree
  to a relative REL_TOL: a tiny reference never matches 0 nor another tiny number;
- an interval (or an inequality, which is a set of numbers) never equals a finite set or tuple:
  `(0,1)` is not `\{0,1\}`, `x>3` is not `3, \infty`;
- a reference equation whose left side is not one variable (`x+y+z=1`) is matched only by an
  equation, never by its right side alone; an assignment (`x=1`, `f(x)=x^2`) still matches `1`;
- an answer equation is read as its right side only when it is not a false statement about numbers:
  `4 = 3` is nothing, `x = 3` and `2+2 = 4` are 3 and 4.

Hedges: an answer with no `\boxed{}` that offers two or more different candidates joined by `or`,
`and/or`, `either ... or` (`The answer is 5 or 6.`, `x = 5 or x = 6`) or `/` between delimited
candidates (`$5$ / $6$`, `x = 5 / x = 6`) is no answer: it scores 0 with the reason (math-verify read
the first or the last candidate, so a hedge scored 1.0 for either gold). Only the answer's part of
the text is read: from the last word "answer" on, else the last line. (`\boxed{3 \text{ or } 4}`
and several different boxed answers are already 0.)

Unbounded answers: an expression whose value needs more than MAX_DIGITS digits (`10^{10^{10}}`,
`100000000!`) is refused before math-verify evaluates it (sympy would compute it for minutes).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

REL_TOL = 1e-4  # numbers agree to this relative difference (on top of math-verify's 6 decimals)
MAX_DIGITS = 10_000  # a value (or an exponent's value) beyond 10**MAX_DIGITS is not evaluated

# ---- text -----------------------------------------------------------------------------------

_DIGIT_GROUP = re.compile(r"(?<=\d)(?:\\,|\{,\})(?=\d{3}(?!\d))")
_ROOT_PAREN = re.compile(r"([√∛∜])\(([^()]{0,200})\)")
_SYMBOLS = {
    "√": "\\sqrt ",
    "∛": "\\sqrt[3] ",
    "∜": "\\sqrt[4] ",
    "∞": "\\infty ",
    "π": "\\pi ",
    "≤": "\\le ",
    "≥": "\\ge ",
    "≠": "\\ne ",
    "×": "\\times ",
    "·": "\\cdot ",
    "\u2212": "-",
}
_SYMBOL = re.compile("|".join(map(re.escape, _SYMBOLS)))
_REPEATING = re.compile(r"(\d{0,40})\.(\d{0,40})\s*\\(?:overline|bar)\s*\{\s*(\d{1,40})\s*\}")


def normalize(text: str) -> str:
    """The text with the forms math-verify misses rewritten (see the module docstring)."""
    text = _DIGIT_GROUP.sub("", text)
    text = _ROOT_PAREN.sub(lambda m: f"{m.group(1)}{{{m.group(2)}}}", text)
    text = _SYMBOL.sub(lambda m: _SYMBOLS[m.group(0)], text)
    return _REPEATING.sub(_repeating_fraction, text)


_ROOT_RUN = re.compile(r"[^\s$√∛∜]{0,200}+[√∛∜][^\s$]{0,200}+")
_MATH_DELIMITERS = ("$", "\\(", "\\[", "\\boxed")


def delimit_roots(response: str) -> str:
    """In a response with no math delimiters, each run holding a Unicode root (`√2`, `3√2/2`) in
    `$...$`: math-verify reads LaTeX only between delimiters, so `The answer is √2.` was read as 2."""
    if any(d in response for d in _MATH_DELIMITERS):
        return response
    return _ROOT_RUN.sub(lambda m: _delimit(m.group(0)), response)


def _delimit(run: str) -> str:
    core = run.rstrip(".,;:!?")
    return f"${core}${run[len(core) :]}"


def _repeating_fraction(m: re.Match[str]) -> str:
    whole, fixed, period = m.group(1) or "0", m.group(2), m.group(3)
    value = Fraction(int(whole)) + Fraction(int(fixed or "0"), 10 ** len(fixed))
    value += Fraction(int(period), (10 ** len(period) - 1) * 10 ** len(fixed))
    return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


_CHOICE_GOLD = re.compile(r"\s*(?:\\text\{\s*)?\(?\s*([A-J])\s*\)?\s*\}?\s*")
# Possessive quantifiers: one pass over a response, however long its runs of spaces.
_CHOICE_ANSWER = [
    re.compile(r"\\boxed\{\s*+(?:\\text(?:bf)?\{\s*+)?\(?\s*+([A-J])\s*+\)?\s*+\}?\s*+\}"),
    re.compile(
        r"(?i:answer)(?:\s++(?i:is))?+\s*+[:：]?\s*+[*_]*+\s*+(?:\$?\\text(?:bf)?\{\s*+)?\(?\s*+([A-J])(?!\w)"
    ),
    re.compile(r"^\s*+[*_]*+\(?\s*+([A-J])\s*+\)?[*_.]*+\s*+$"),
]


def choice_letter(expected: str) -> str | None:
    """The letter when the reference is one multiple-choice letter A-J, else None."""
    m = _CHOICE_GOLD.fullmatch(expected)
    return m.group(1) if m else None


def answered_letter(response: str) -> str | None:
    """The choice letter the answer gives last, None when it gives none."""
    found: tuple[int, str] | None = None
    for pattern in _CHOICE_ANSWER:
        for m in pattern.finditer(response):
            if found is None or m.start() >= found[0]:
                found = (m.start(), m.group(1))
    return found[1] if found else None


_NUM = r"-?+\d++(?:\.\d++)?+(?:/\d++(?:\.\d++)?+)?+"
_DELIMITED = r"(?:\$[^$\n]{1,200}+\$|[A-Za-z]\s*+=\s*+" + _NUM + ")"
_CANDIDATE = f"(?:{_DELIMITED}|{_NUM})"
_FILLER = r"(?:\s++(?:maybe|possibly|perhaps|else))?+"
_HEDGES = [
    re.compile(rf"({_CANDIDATE})\s*+,?+\s*+\(?+\s*+(?i:or|and/or){_FILLER}\s++({_CANDIDATE})(?![\w/])"),
    re.compile(rf"({_DELIMITED})\s*+/\s*+({_DELIMITED})"),
]
_ANSWER_WORD = re.compile(r"(?i)\banswer")
_REGION_CHARS = 2000  # of the answer's part of the text, the last characters read for hedges


def hedge(response: str) -> tuple[str, str] | None:
    """Two different candidate answers an unboxed response offers (see the module docstring), or
    None: a response with a `\boxed{}` is read by its boxes."""
    if "\\boxed" in response:
        return None
    marks = list(_ANSWER_WORD.finditer(response[-100_000:]))
    if marks:
        region = response[-100_000:][marks[-1].start() :]
    else:
        lines = [line for line in response.splitlines() if line.strip()]
        region = lines[-1] if lines else ""
    region = region[-_REGION_CHARS:]
    for pattern in _HEDGES:
        for m in pattern.finditer(region):
            a, b = m.group(1), m.group(2)
            if not _same_candidate(a, b):
                return a, b
    return None


def _same_candidate(a: str, b: str) -> bool:
    """`5` and `x = 5.0` are one candidate; different text is two."""

    def core(c: str) -> str:
        return re.sub(r"^[A-Za-z]\s*=", "", c.strip("$").replace(" ", ""))

    x, y = core(a), core(b)
    try:
        return Fraction(x) == Fraction(y)
    except (ValueError, ZeroDivisionError):
        return x == y


# ---- sympy (worker only) -----------------------------------------------------------------------


def too_large(expr: Any, budget: int = 5000) -> bool:
    """Whether evaluating `expr` may need numbers beyond 10**MAX_DIGITS (or it is too big to look
    at: more than `budget` nodes). Cheap: bounds log10 of each numeric node without evaluating."""
    nodes = [0]

    def log10_bound(e: Any) -> float:
        """An upper bound of log10|value| of a numeric node (0 for symbols); inf when unbounded."""
        import math

        import sympy

        nodes[0] += 1
        if nodes[0] > budget:
            return math.inf
        if isinstance(e, sympy.Integer):
            whole = abs(int(e))
            return math.log10(whole) if 0 < whole < 10**50 else whole.bit_length() * 0.302
        if isinstance(e, sympy.Rational):
            return max(log10_bound(sympy.Integer(e.p)), log10_bound(sympy.Integer(e.q)))
        if isinstance(e, sympy.Float):  # mantissa * 2**exponent, bc bits of mantissa
            _sign, _man, exponent, bits = e._mpf_
            return float(abs(exponent + bits) * 0.302 + 1)
        if isinstance(e, sympy.Pow):
            base, exp = log10_bound(e.base), log10_bound(e.exp)
            if exp > 6:  # an exponent beyond a million
                return math.inf
            try:
                power = abs(float(e.exp)) if e.exp.is_number else 10.0**exp
            except (TypeError, ValueError):
                power = 10.0**exp
            return max(base, 0.302) * max(power, 1.0)  # a symbol's base counts as 2
        if isinstance(e, sympy.Product | sympy.Sum):  # a product of 10**4 factors or more
            count = max(log10_bound(bound) for limit in e.limits for bound in limit[1:])
            term = log10_bound(e.function)
            return math.inf if count > 4 and isinstance(e, sympy.Product) else 10.0**count * (term + 1)
        if isinstance(e, sympy.factorial | sympy.factorial2 | sympy.gamma | sympy.binomial):
            arg = log10_bound(e.args[0])
            return math.inf if arg > 6 else 10.0**arg * max(arg, 1.0)
        args = getattr(e, "args", ())
        if not args:
            return 0.0
        bounds = [log10_bound(a) for a in args]
        return sum(bounds) + 1 if isinstance(e, sympy.Mul) else max(bounds) + 1

    try:
        return log10_bound(expr) > MAX_DIGITS
    except RecursionError:
        return True
    except Exception:  # a node this bound does not know: the worker's timeout still bounds it
        return False


_installed = False


def install_guards() -> None:
    """Wrap math-verify's numeric, set and expression comparisons with the rules above (once per
    process; math-verify's own functions decide everything else). It runs in the math
    environment's worker processes, which serve no other environment (one pool per environment)."""
    global _installed
    if _installed:
        return
    import sympy
    from math_verify import grader
    from sympy import Eq, Interval, Tuple, Union
    from sympy.core.function import UndefinedFunction
    from sympy.sets.sets import FiniteSet

    numeric_eq, compare_sets, expr_eq = (
        grader.sympy_numeric_eq,
        grader.sympy_compare_sets,
        grader.sympy_expr_eq,
    )

    def relatively_close(a: Any, b: Any) -> bool:
        if grader.get_pct_val(a) is not None or grader.get_pct_val(b) is not None:
            return True  # 9% against 9 or 0.09: math-verify's own rule
        if isinstance(a, sympy.MatrixBase) or isinstance(b, sympy.MatrixBase):
            return True  # compared element by element through numeric_eq
        try:
            x, y = sympy.N(grader.safe_sympy_doit(a), 30), sympy.N(grader.safe_sympy_doit(b), 30)
            if x.free_symbols or y.free_symbols:
                return True  # not numbers: math-verify's symbolic rules
            diff, scale = abs(x - y), max(abs(x), abs(y))
            return bool(diff == 0 or diff <= REL_TOL * scale)
        except Exception:
            return False  # a number that cannot be evaluated is not known to be equal

    def guarded_numeric_eq(a: Any, b: Any, float_rounding: int, numeric_precision: int) -> bool:
        return bool(numeric_eq(a, b, float_rounding, numeric_precision)) and relatively_close(a, b)

    def interval_like(s: Any) -> bool:
        return isinstance(s, Interval | Union) or (grader.is_relation(s) and not grader.is_equation(s))

    def finite_like(s: Any) -> bool:
        return isinstance(s, FiniteSet | Tuple)

    def interval_against_finite(gold: Any, pred: Any) -> bool:
        return (interval_like(gold) and finite_like(pred)) or (finite_like(gold) and interval_like(pred))

    def guarded_compare_sets(gold: Any, pred: Any, *rest: Any) -> bool:
        if interval_against_finite(gold, pred):
            return False
        return bool(compare_sets(gold, pred, *rest))

    def one_variable_lhs(rel: Any) -> bool:
        """`x = ...` or `f(x) = ...`: an assignment, which a bare right side answers."""
        first = rel._unsorted_args[0] if isinstance(rel, sympy.And) else rel
        lhs = first.lhs if isinstance(first, Eq) else None
        return isinstance(lhs, sympy.Symbol) or isinstance(getattr(lhs, "func", None), UndefinedFunction)

    def false_about_numbers(rel: Any) -> bool:
        links = rel._unsorted_args if isinstance(rel, sympy.And) else [rel]
        for link in links:
            if isinstance(link, Eq) and not link.lhs.free_symbols and not link.rhs.free_symbols:
                if not (expr_eq(link.lhs, link.rhs, 6, 15) and relatively_close(link.lhs, link.rhs)):
                    return True
        return False

    def guarded_expr_eq(gold: Any, pred: Any, *rest: Any, **kw: Any) -> bool:
        if grader.is_equation(gold) and not grader.is_relation(pred) and not one_variable_lhs(gold):
            return False  # x+y+z=1 is not answered by 1
        if grader.is_equation(pred) and not grader.is_relation(gold) and false_about_numbers(pred):
            return False  # \boxed{4 = 3} is no answer
        if interval_against_finite(gold, pred):
            return False
        return bool(expr_eq(gold, pred, *rest, **kw))

    grader.sympy_numeric_eq = guarded_numeric_eq
    grader.sympy_compare_sets = guarded_compare_sets
    grader.sympy_expr_eq = guarded_expr_eq
    _installed = True
