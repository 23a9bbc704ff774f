r"""What the `math` environment adds around math-verify, so wrong answers stop matching and right
ones in common forms stop scoring 0 (issues 27 and 38). The text helpers are plain Python;
`install_guards`, `too_large` and `decide_large` need sympy and run only in the worker process.

Text, before math-verify parses it (answer and reference alike):
- characters folded (rollmesh.mesh.answer_text): zero-width characters dropped, fullwidth and
  other Unicode digits ASCII (`３` is `3`), Unicode minus signs and dashes `-` (`–3` is `-3`);
  superscripts are powers (`2³` is `2^{3}`, `10⁻³` is `10^{-3}`);
- digit groups `1\,000` and `1{,}000` are `1000`; `√`, `∛`, `∞`, `π`, `≤`, `≥`, `≠`, `×`, `·`
  are their LaTeX; a repeating decimal `0.\overline{3}` is the fraction `\frac{1}{3}`;
  in an answer with no math delimiters, a run holding a root or superscript (`√2`, `3√2/2`, `2³`)
  is put between `$...$` (`The answer is √2.` reads as `\boxed{√2}` does, not as 2).

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
the text is read: from the last word "answer" on, else the last line.

One answer, read whole (`box_hedge`, `unboxed_hedge`): the last `\boxed{}` is the answer only
when it is the whole answer: no operator right after or before it (`\boxed{3}^2`, `-\boxed{3}`,
`\sqrt{\boxed{9}}`), no second line in it (`\boxed{3 \\ 4}`), no other box next to it with
another value. When the reference is one value (not a set, tuple, interval, inequality, matrix or
piecewise), the box (or, without one, the last `$...$` from its last `=` on) must be one value:
no word of hedge (`or`, `maybe`, `if`, ... in any `\text{}`-like group: math-verify turned `or`
into a comma), no connective (`\lor`, `\mid`, `|`, `\to`, `;`), no LaTeX command math-verify
does not read as part of a value (it dropped it and read what was left: `3 \lor 4` was 4), no
two numbers side by side (`3 \quad 4` was 7), and no `or` from the box to the end of its line
(`\boxed{3} (or 4 if rounding up)`). Each is 0 with the reason.

Large values: an expression whose value needs more than MAX_DIGITS digits (`10^{10^{10}}`), or a
number beyond 10**EXACT_DIGITS, is not given to math-verify (sympy would compute it for minutes,
or simplify it for seconds): `decide_large` decides it exactly within a bound (equal to the unit
and six decimals, the same rule math-verify applies to small numbers; different magnitudes are
different values), and what it cannot decide in bounds is the named outcome `undecided`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from rollmesh.mesh.answer_text import fold
from rollmesh.mesh.answer_text import last_box
from rollmesh.mesh.answer_text import struck

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
}
_SYMBOL = re.compile("|".join(map(re.escape, _SYMBOLS)))
_REPEATING = re.compile(r"(\d{0,40})\.(\d{0,40})\s*\\(?:overline|bar)\s*\{\s*(\d{1,40})\s*\}")


_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻", "0123456789+-")
_SUPERSCRIPT_RUN = re.compile("[⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻]++")


def normalize(text: str) -> str:
    """The text with the forms math-verify misses rewritten (see the module docstring)."""
    text = fold(text)
    text = _SUPERSCRIPT_RUN.sub(lambda m: f"^{{{m.group(0).translate(_SUPERSCRIPTS)}}}", text)
    text = _DIGIT_GROUP.sub("", text)
    text = _ROOT_PAREN.sub(lambda m: f"{m.group(1)}{{{m.group(2)}}}", text)
    text = _SYMBOL.sub(lambda m: _SYMBOLS[m.group(0)], text)
    return _REPEATING.sub(_repeating_fraction, text)


_UNICODE_MATH = "√∛∜⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻"
_UNICODE_RUN = re.compile(rf"[^\s${_UNICODE_MATH}]{{0,200}}+[{_UNICODE_MATH}][^\s$]{{0,200}}+")
_MATH_DELIMITERS = ("$", "\\(", "\\[", "\\boxed")


def delimit_unicode_math(response: str) -> str:
    """In a response with no math delimiters, each run holding a Unicode root or superscript (`√2`,
    `3√2/2`, `2³`) in `$...$`: math-verify reads LaTeX only between delimiters, so `The answer is
    √2.` was read as 2 and `2³` as 2."""
    if any(d in response for d in _MATH_DELIMITERS):
        return response
    # Only the text's end holds the answer: runs before its last 2,000 characters stay as they
    # are (each delimited run is one more parse for math-verify: `√(` * 50,000 was 500 parses).
    head, tail = response[:-2000], response[-2000:]
    return head + _UNICODE_RUN.sub(lambda m: _delimit(m.group(0)), tail)


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


_TEXT_GROUP = re.compile(
    r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mbox)\s*+\{([^{}]{0,500}+)\}"
)
_HEDGE_WORD = re.compile(
    r"(?i)(?<![A-Za-z\\])(or|either|maybe|possibly|perhaps|otherwise|alternatively|else|unless|if)(?![A-Za-z])"
)
_OPERATOR_AFTER_BOX = re.compile(
    r"\s*+(?:[\^_′]|!(?![\s]|$)|'(?![A-Za-z])|[⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻]"
    r"|(?:[-+*/×·÷]|\\(?:cdot|times|div|pm|mp))\s*+(?:[\d({\\]|[A-Za-z](?![A-Za-z])))"
)
_OPERATOR_BEFORE_BOX = re.compile(
    r"(?:(?:[-+*/^_×·÷\d)]|\\(?:cdot|times|div|pm|mp|sqrt))\s*+\{?+"
    r"|(?:\\(?:sqrt|frac|dfrac|tfrac)(?:\[[^\]]{0,20}+\])?+|\})\s*+\{)\s*+$"
)
_STRIKE_COMMAND_BEFORE = re.compile(r"\\(?:b|x)?cancel\s*+\{\s*+$|\\(?:sout|st|xout)\s*+\{\s*+$")
_BULLET = re.compile(r"^\s*+[-*+]\s++$")


def one_value(gold: Any) -> bool:
    """Whether a parsed reference is one value (a number, an expression, an assignment `x = 3`),
    not several (a set, tuple, interval, inequality, piecewise, matrix): only then is an answer that
    offers two candidates a hedge."""
    import sympy
    from sympy.logic.boolalg import BooleanFunction

    if not isinstance(gold, sympy.Basic) or isinstance(
        gold, sympy.Set | sympy.Tuple | BooleanFunction | sympy.MatrixBase
    ):
        return False
    if isinstance(gold, sympy.core.relational.Relational) and not isinstance(gold, sympy.Eq):
        return False
    return not gold.has(sympy.Piecewise)


# What a boxed answer that is one value may hold: LaTeX commands math-verify reads as part of a
# value (anything else it drops, and reads what is left: `3 \lor 4` was 4, `3 \unknown 4` 4).
_READ_COMMANDS = frozenset(
    "frac dfrac tfrac cfrac sqrt pi infty infin cdot times div pm mp left right big Big bigl bigr Bigl "
    "Bigr text textbf textrm textit textnormal textup mathrm mathbf mathit mathbb mathcal mathsf "
    "boldsymbol bm mbox operatorname sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log "
    "ln lg exp min max gcd lcm binom dbinom tbinom overline bar hat vec widehat dot degree circ "
    "displaystyle textstyle quad qquad begin end le leq ge geq ne neq lt gt in notin subset subseteq "
    "supset supseteq cap emptyset varnothing setminus cdots ldots dots angle triangle perp prime "
    "approx sim equiv pmod bmod mod lfloor rfloor lceil rceil langle rangle vert lvert rvert Vert "
    "cong deg det dim lim sum prod int partial nabla ell hbar Re Im emph underline boxed fbox "
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi "
    "omicron varpi rho varrho sigma varsigma tau upsilon phi varphi chi psi omega Gamma Delta Theta "
    "Lambda Xi Pi Sigma Upsilon Phi Psi Omega textdegree rm bf it tt sf hbox phantom vphantom "
    "lbrace rbrace lbrack rbrack backslash cdotp colon limits arcsec arccsc arccot coth sech csch Pr "
    "arg inf sup liminf limsup ast star geqslant leqslant mathfrak tilde check acute grave breve "
    "mathring ddot".split()
)
# Commands and characters that join two values into something that is not one of them.
_CONNECTIVES = frozenset(
    "lor vee land wedge mid parallel to rightarrow Rightarrow implies iff leftrightarrow "
    "Leftrightarrow longrightarrow cup neg lnot".split()
)
_COMMAND_NAME = re.compile(r"\\[A-Za-z]++")
_SPACING = re.compile(
    r"\\(?:[,;:! {}]|q?quad(?![A-Za-z])|hspace\s*+\{[^{}]{0,50}+\}|phantom\s*+\{[^{}]{0,50}+\})|~"
)
_ARGUMENTS = re.compile(r"\}\s++\{")  # `\frac{1} {2}`: one fraction
_SIDE_BY_SIDE = re.compile(r"\d\}*+\s++\{*+\d")
_MARKDOWN_END = re.compile(r"(?:\*\*|__)\s*+$")


def _not_one_value(content: str) -> str | None:
    """What keeps a boxed answer from being one value (None when nothing does), for a reference
    that is one: a word of hedge, a connective, a command math-verify does not read as part of a
    value, two numbers side by side."""
    word = _HEDGE_WORD.search(_COMMAND_NAME.sub(" ", content))
    if word:
        return f"hedges ({word.group(1)!r})"
    names = {m.group(0)[1:] for m in _COMMAND_NAME.finditer(content)}
    joined = sorted(names & _CONNECTIVES) + [c for c in "∨∧→⇒⇔;" if c in content]
    if joined or content.count("|") % 2:
        return f"joins values with {(joined or ['|'])[0]!r}: not one value"
    unread = sorted(names - _READ_COMMANDS - _CONNECTIVES)
    if unread:
        return f"holds \\{unread[0]}, which the check does not read as part of a value"
    if _SIDE_BY_SIDE.search(_ARGUMENTS.sub("}{", _SPACING.sub(" ", content))):
        return "holds two numbers side by side: not one value"
    return None


_SEGMENT = re.compile(
    r"\$\$([^$]{1,1000}+)\$\$|\$([^$]{1,1000}+)\$|\\\[((?:(?!\\\]).){1,1000}+)\\\]|\\\(((?:(?!\\\)).){1,1000}+)\\\)",
    re.DOTALL,
)
_PROSE_COMMANDS = frozenset("therefore because blacksquare square qed Box checkmark".split())


def not_one_answer(
    response: str, one_value: bool, same: Callable[[str, str], bool] | None = None
) -> str | None:
    """Why the response's answer is not one whole answer (None when it is): its last box read by
    `box_hedge`, else (a reference that is one value) its last math segment by `unboxed_hedge`.
    `same(a, b)` says whether two written answers are one value (`\\frac{1}{2}` and `0.5`: an
    alternative form is no hedge)."""
    if last_box(response) is not None:
        return box_hedge(response, one_value, same)
    return unboxed_hedge(response) if one_value else None


def unboxed_hedge(response: str) -> str | None:
    """For a response with no `\boxed{}` and a reference that is one value: why the last math
    segment (`$...$`, `\\(...\\)`, `\\[...\\]`), from its last `=` on, is not one value (math-verify
    reads that segment, and from a failed parse only a part of it: `$3 \\lor 4$` was 4)."""
    tail = response[-3000:]
    last = None
    for m in _SEGMENT.finditer(tail):
        last = m
    if last is None:
        return None
    segment = next(g for g in last.groups() if g is not None)
    value = segment.rsplit("=", 1)[-1]
    for name in _PROSE_COMMANDS:
        value = value.replace(f"\\{name}", " ")
    problem = _not_one_value(value)
    return None if problem is None else f"the answer {problem} ({value.strip()[:40]!r}): scored 0"


def box_hedge(response: str, one_value: bool, same: Callable[[str, str], bool] | None = None) -> str | None:
    """Why the last `\boxed{}` is not one whole answer (None when it is): an operator right after
    or before it (`\boxed{3}^2`, `-\boxed{3}`: the written answer is not the box), two lines in it
    (`\boxed{3 \\ 4}`), and, when the reference is one value (`one_value`), a word of hedge in it
    (`\boxed{3 \text{ (or } 4)}`: math-verify turned `or` into a comma) or two candidates joined
    by `or` from it to the end of its line (`\boxed{3} (or 4 if rounding up)`)."""
    box = last_box(response)
    if box is None:
        return None
    start, inner, end = box
    content = response[inner:end]
    if struck(response, start) or _STRIKE_COMMAND_BEFORE.search(response, max(0, start - 40), start):
        return f"the boxed answer is struck through ({response[start : end + 1][:40]!r}): not the answer"
    if _OPERATOR_AFTER_BOX.match(response, end + 1):
        return (
            f"an operator after the boxed answer ({response[start : end + 8]!r}): the box is not the answer"
        )
    line = _MARKDOWN_END.sub("", response[max(0, start - 200) : start].rsplit("\n", 1)[-1].replace("$", ""))
    if _OPERATOR_BEFORE_BOX.search(line) and not _BULLET.match(line):
        written = line[-8:] + response[start : end + 1]
        return f"an operator before the boxed answer ({written!r}): the box is not the answer"
    if one_value:
        before = last_box(response[:start])
        if before is not None and start - before[2] <= 70:
            first = response[before[1] : before[2]]
            if first.split() != content.split():
                return f"several boxed answers ({first[:20]!r}, {content[:20]!r}): not one answer, scored 0"
    if "\\begin" not in content and re.search(r"\\\\(?![A-Za-z])", content):
        return f"the boxed answer holds two lines ({content[:40]!r}): two answers, scored 0"
    if not one_value:
        return None
    problem = _not_one_value(content)
    if problem is not None:
        return f"the boxed answer {problem} ({content[:40]!r}): scored 0"
    flat = _COMMAND_NAME.sub(" ", content)
    rest = response[end + 1 : end + 1 + _REGION_CHARS].split("\n", 1)[0]
    region = (flat + rest).replace("{", " ").replace("}", " ")
    for pattern in _HEDGES:
        m = pattern.match(region.strip())
        if m and not _same_candidate(m.group(1), m.group(2)):
            return f"the answer hedges between {m.group(1)!r} and {m.group(2)!r}: scored 0"
    other = _OR_AFTER_BOX.match(rest)  # `\boxed{\frac{1}{2}} (or 1/3)`: whatever the box holds
    if other:
        alt = other.group("alt")
        alt = alt[7:-1] if alt.startswith("\\boxed{") else alt.strip("$")
        written_same = "".join(alt.split()) == "".join(content.split()) or _same_candidate(content, alt)
        if not written_same and not (same is not None and same(content, alt)):
            return f"the answer hedges between {content[:40]!r} and {alt[:40]!r}: scored 0"
    return None


_OR_AFTER_BOX = re.compile(
    r"\s*+[,;:]?+\s*+\(?+\s*+(?i:or|and/or)\s++(?:(?i:maybe|possibly|perhaps|else|even|rather)\s++)?+"
    r"(?P<alt>\$[^$\n]{1,200}+\$|\\boxed\{[^{}\n]{1,200}+\}|[A-Za-z]\s*+=\s*+-?+\d[\d.,/]*+|-?+\d[\d.,/]*+)"
)


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


def log10_bound(expr: Any, budget: int = 5000, exponent_digits: float = 6.0) -> float:
    """An upper bound of log10 of the magnitude of `expr`'s value (inf when it is unbounded: an
    exponent beyond 10**exponent_digits, a product of 10**4 factors or more, a factorial of more
    than a million, more than `budget` nodes). Cheap: bounds each numeric node without evaluating.
    Raises RecursionError (too deep) and whatever a node it does not know raises."""
    import math

    import sympy

    nodes = [0]

    def bound(e: Any) -> float:
        """An upper bound of log10|value| of a numeric node (0 for symbols); inf when unbounded."""
        nodes[0] += 1
        if nodes[0] > budget:
            return math.inf
        if isinstance(e, sympy.Integer):
            whole = abs(int(e))
            return math.log10(whole) if 0 < whole < 10**50 else whole.bit_length() * 0.302
        if isinstance(e, sympy.Rational):
            return max(bound(sympy.Integer(e.p)), bound(sympy.Integer(e.q)))
        if isinstance(e, sympy.Float):  # mantissa * 2**exponent, bc bits of mantissa
            _sign, _man, exponent, bits = e._mpf_
            return float(abs(exponent + bits) * 0.302 + 1)
        if isinstance(e, sympy.Pow):
            base, exp = bound(e.base), bound(e.exp)
            if exp > exponent_digits:
                return math.inf
            try:
                power = abs(float(e.exp)) if e.exp.is_number else 10.0**exp
            except (TypeError, ValueError):
                power = 10.0**exp
            return max(base, 0.302) * max(power, 1.0)  # a symbol's base counts as 2
        if isinstance(e, sympy.Product | sympy.Sum):  # a product of 10**4 factors or more
            count = max(bound(limit) for limits in e.limits for limit in limits[1:])
            term = bound(e.function)
            return math.inf if count > 4 and isinstance(e, sympy.Product) else 10.0**count * (term + 1)
        if isinstance(e, sympy.factorial | sympy.factorial2 | sympy.gamma | sympy.binomial):
            arg = bound(e.args[0])
            return math.inf if arg > 6 else 10.0**arg * max(arg, 1.0)
        args = getattr(e, "args", ())
        if not args:
            return 0.0
        bounds = [bound(a) for a in args]
        return sum(bounds) + 1 if isinstance(e, sympy.Mul) else max(bounds) + 1

    return bound(expr)


def too_large(expr: Any, budget: int = 5000) -> bool:
    """Whether evaluating `expr` exactly may need numbers beyond 10**MAX_DIGITS (or it is too big to
    look at: more than `budget` nodes): math-verify is not given it (decide_large is)."""
    return _sized(expr, budget)[1]


def _sized(expr: Any, budget: int = 5000) -> tuple[float | None, bool]:
    """(log10_bound(expr), None when it raised; too_large(expr)): the bound taken once."""
    try:
        bound = log10_bound(expr, budget)
    except RecursionError:
        return None, True
    except Exception:  # a node this bound does not know: the worker's timeout still bounds it
        return None, False
    return bound, bound > MAX_DIGITS


EXACT_DIGITS = 100  # a number beyond 10**EXACT_DIGITS is compared by decide_large, not math-verify


def for_decide_large(gold: Reference, pred: list[Any]) -> bool:
    """Whether a comparison goes to decide_large (the reference, math-verify's parse of the answer):
    a value too large for math-verify anywhere, or two numbers (no variables, not a set or
    relation) one of them beyond 10**EXACT_DIGITS, which math-verify's simplify compares slowly
    (20 s against `0` for NeMo Gym's `(2+\\sqrt{3})^{2016}` row) and decide_large exactly in
    milliseconds. A bound that cannot be taken (a node it does not know) is math-verify's."""
    sized = [_sized(x) for x in pred if not isinstance(x, str)]
    if gold.too_large or any(large for _, large in sized):
        return True
    if gold.number_bound is None or not _plain_number(pred[0]):
        return False
    bound = sized[0][0]  # pred[0]'s (a number, so no str)
    return bound is not None and max(gold.number_bound, bound) > EXACT_DIGITS


def _plain_number(x: Any) -> bool:
    import sympy

    return isinstance(x, sympy.Expr) and not x.free_symbols


@dataclass(frozen=True)
class Reference:
    """A reference answer as the check reads it (`reference`): math-verify's parse of its
    normalized text (empty when it has none), whether it is one value (`one_value`), whether a
    parsed value is too large for math-verify (`too_large`), and the log10 bound of its first value
    when that is a number without variables (None when it is not, or has no bound)."""

    parsed: tuple[Any, ...]
    one_value: bool
    too_large: bool
    number_bound: float | None
    immutable: bool = True  # every parsed value a str or a sympy Basic (a Matrix is mutable)


def _read_reference(expected: str) -> Reference:
    import sympy
    from math_verify import parse

    text = normalize(expected)
    gold_text = text if "$" in text or "\\boxed" in text else f"${text}$"
    parsed = tuple(parse(gold_text, parsing_timeout=None))  # type: ignore[arg-type]
    if not parsed:
        return Reference((), False, False, None)
    sized = [_sized(x) for x in parsed if not isinstance(x, str)]
    large = any(big for _, big in sized)
    bound = sized[0][0] if _plain_number(parsed[0]) else None  # a number: parsed[0] is no str
    immutable = all(isinstance(x, str | sympy.Basic) for x in parsed)
    return Reference(parsed, one_value(parsed[0]), large, bound, immutable)


_cached_reference = functools.lru_cache(maxsize=1024)(_read_reference)
CACHED_CHARS = 2000  # a reference longer than this is read on every check, not kept


def reference(expected: str) -> Reference:
    """The reference `expected` read once per worker (the last 1,024 references of at most
    CACHED_CHARS characters are kept): a task's samples are checked against one parse. Parsing
    is deterministic (math-verify's own timeouts are off) and a kept reference is used again only
    when nothing can change it (`parsed` a tuple of strings and sympy's immutable values), so it is
    the one a new parse gives. A reference holding a matrix (mutable) is not kept: its Reference is
    read again each check, though math-verify's own parse cache (20 entries) may return the same
    matrix object, as it did before references were kept; nothing here mutates it."""
    if len(expected) <= CACHED_CHARS:
        kept = _cached_reference(expected)
        if kept.immutable:
            return kept
    return _read_reference(expected)


MAX_MAGNITUDE = 1e15  # decide_large evaluates values below 10**MAX_MAGNITUDE (to a few digits)
MAX_COMPARE_DIGITS = 100_000  # and compares values of up to this many digits to the unit
DECIMALS = 6  # math-verify's rule: numbers are equal to six decimal places


def decide_large(gold: Any, pred: Any) -> tuple[bool | None, str]:
    """Whether two values too large for math-verify are equal, decided exactly within a bound:
    (True | False, how) or (None, why nothing could decide). Runs in the worker, under its timeout.

    The same expression is equal; a decimal literal is the exact number its digits show (`1.1` is
    11/10). Two numbers are evaluated to a few digits first (sympy's
    adaptive evalf, strict: an evaluation that loses its precision decides nothing): different
    magnitudes are different values. Numbers of the same magnitude are evaluated to every digit
    of their integer part and DECIMALS more (at most MAX_COMPARE_DIGITS digits), and are equal when
    they agree to DECIMALS decimal places and to a relative REL_TOL: the rule math-verify applies
    to smaller numbers, so `x + 1` never equals `x` however large `x` is. What has free symbols,
    is not a number (a set, a relation), is beyond 10**MAX_MAGNITUDE or needs more digits is
    undecided (None)."""
    import math

    import mpmath
    import sympy

    if gold == pred:
        return True, "the same expression"
    if not isinstance(gold, sympy.Expr) or not isinstance(pred, sympy.Expr):
        return None, "a value too large to evaluate inside a set, relation or matrix"
    # A written decimal is the exact value it shows (`1.1` is 11/10, not its nearest binary float):
    # `1.1\times10^{200}` and `11\times10^{199}` are one number.
    gold, pred = _exact_decimals(gold), _exact_decimals(pred)
    if gold == pred:
        return True, "the same value"
    if gold.free_symbols or pred.free_symbols:
        return None, "an expression with variables too large to expand"
    try:
        if max(log10_bound(gold, exponent_digits=15), log10_bound(pred, exponent_digits=15)) > MAX_MAGNITUDE:
            return (
                None,
                "a value too large to evaluate (a tower of powers, a factorial or product beyond bounds)",
            )
        magnitudes = [_log10_magnitude(x.evalf(15, strict=True)) for x in (gold, pred)]
        if magnitudes[0] is None or magnitudes[1] is None:
            same = magnitudes[0] is magnitudes[1]
            return same, "both are 0" if same else "one is 0, the other is not"
        low, high = sorted(magnitudes)  # type: ignore[type-var]
        assert low is not None and high is not None
        if high - low > 1:
            return False, f"their magnitudes differ (~10^{low:.0f} and ~10^{high:.0f})"
        digits = max(math.ceil(high), 0) + DECIMALS + 30
        if digits > MAX_COMPARE_DIGITS:
            return (
                None,
                f"values of ~10^{high:.0f} are not compared to the unit (over {MAX_COMPARE_DIGITS} digits)",
            )
        with mpmath.workdps(digits + 10):
            a = _complex(gold.evalf(digits, strict=True))
            b = _complex(pred.evalf(digits, strict=True))
            diff, scale = abs(a - b), max(abs(a), abs(b))
            equal = diff < mpmath.mpf(10) ** -DECIMALS / 2 and diff <= REL_TOL * scale
    except (ArithmeticError, TypeError, ValueError, RecursionError) as exc:  # PrecisionExhausted too
        return None, f"the values cannot be evaluated ({type(exc).__name__})"
    return bool(equal), f"compared to {DECIMALS} decimal places at {digits} digits"


def _exact_decimals(expr: Any) -> Any:
    """`expr` with each decimal literal (a sympy Float) the rational number its digits show."""
    import sympy

    floats = expr.atoms(sympy.Float)
    if not floats:
        return expr
    return expr.xreplace({f: sympy.Rational(str(f)) for f in floats if f.is_finite})


def _complex(value: Any) -> Any:
    """An evalf result as an mpmath complex at mpmath's working precision (ValueError when it did
    not evaluate to a number)."""
    import mpmath

    re, im = value.as_real_imag()
    if not (re.is_Number and im.is_Number):
        raise ValueError("not a number")
    bits = mpmath.mp.prec
    return mpmath.mpc(mpmath.mpf(re._as_mpf_val(bits)), mpmath.mpf(im._as_mpf_val(bits)))


def _log10_magnitude(value: Any) -> float | None:
    """log10 of |value| (a number evalf gave), None when it is 0."""
    import mpmath

    z = _complex(value)
    if z == 0:
        return None
    return float(mpmath.log10(abs(z)))


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
    from sympy import Eq
    from sympy import Interval
    from sympy import Tuple
    from sympy import Union
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
