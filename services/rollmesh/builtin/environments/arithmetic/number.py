r"""The final answer of a text, read as ONE value with a number grammar (issue 38).

Where the answer is: the text is folded first (rollmesh.mesh.answer_text: zero-width characters
dropped, fullwidth and other Unicode digits made ASCII, Unicode minus signs and dashes made `-`);
then its last number (a digit run or a vulgar fraction), within the last WINDOW characters, is
found, and the answer is everything around it that can belong to a written value: digits and
their separators, signs, operators, brackets, superscripts, and the LaTeX of values (`\frac`,
`\times`, `\boxed{}`, `\left(`, thin spaces). Words, `=`, `,` after a number, `$` and other
punctuation end it. Brackets that do not close inside it are not part of it.

The grammar of one value (anything else is refused: score 0 with the reason, never a guess):

    value    := [sign] (mixed | ratio)             one sign: `-5`, `- 5`, `-(5)`, `+5`
    mixed    := integer (vulgar | \frac{a}{b})      2½, 2\frac{1}{2}: a proper fraction only
    ratio    := product [/ product]                 10/2
    product  := power [(× | · | * | \times | \cdot) 10^k]   scientific notation only
    power    := atom [(^ | **) exponent | superscripts]     2^{10}, 2**10, 2^10, 2³, 10⁻³
    atom     := number | vulgar | (value) | [value] | {value} | \frac{value}{value} | \frac12
              | \boxed{value} | \text{value} | \mathbf{value} ...
    number   := digits [separators] [.digits] [e[+-]digits]

- Thousands separators: `,` (`{,}`), `_`, `'`, `’`, or a space (plain, no-break, thin, narrow,
  LaTeX `\,` `\ ` `\;` `\!` `~`): one kind throughout, groups of three after a first group of one
  to three digits. Digits apart by spaces that are not such groups are separate numbers (`1 2 3`:
  the last is `3`). Any other comma, underscore or apostrophe is refused (`1,5`: a decimal comma
  or a list?), as are two kinds in one number and more than one `.` (`1.2.3`, `1.000.000`).
- Refused forms (each with its own reason): an expression, i.e. a value followed by `+`, `-`,
  `÷`, `\div`, a product that is not scientific notation, `a/b/c`, chained powers `2^3^2`,
  implicit products `2(5)`; a percentage or per mille (`5%`, `5\%`, `5‰`); a factorial (`5!`); a
  root (`√25`, `\sqrt{25}`, `sqrt(25)`); a power in words (`5 squared`); a number glued to a word
  (`x10`, `5k`, `0x10`: a base prefix); struck through (`~~5~~`, `<del>5</del>`, `\cancel{5}`)
  or carrying a combining mark or number sign (`5̶`, `5₁₀`); an argument of a LaTeX function
  (`\log 100`, `\binom{5}{2}`); a last digit that is a LaTeX command (`\5`); a value right after
  a sign, operation or negation in words (`minus 5`, `negative 5`, `10 over 2`, `2 times 5`,
  `divided by 5`, `not 5`) or `≠` (`x != 5`, `x \neq 5`); `±`; a list
  bullet (`- 5` opening a line: a bullet or a minus?); two signs (`--5`); a fractional power; a
  value or exponent beyond 10**MAX_DIGITS (not evaluated).
- Values are exact (fractions): `\frac{10}{2}` is 5, `2^{10}` is 1024, `5\times10^{3}` is 5000,
  `1e3` is 1000, `2½` is 5/2 (not an integer).

Cost: one pass of possessive patterns over at most WINDOW characters, a linear parse with a
nesting bound, and arithmetic bounded by MAX_DIGITS: it runs on the event loop.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

from rollmesh.mesh.answer_text import fold_with_positions
from rollmesh.mesh.answer_text import struck

WINDOW = 4096  # the answer is read in the text's last WINDOW characters
VALUE_CHARS = 1024  # a written value longer than this is refused
MAX_DIGITS = 4000  # no value, exponent or literal beyond 10**MAX_DIGITS is evaluated
_MAX_DEPTH = 32  # brackets nested deeper than this are refused
NOT_INTEGER = "the last number is not an integer"


class Refused(ValueError):
    """What cannot be read as one value without guessing; the message is the reason."""


@dataclass(frozen=True)
class Reading:
    """The final answer of a text: as written, its value (None when refused) and the reason it has
    none ("" when it has one)."""

    text: str
    value: Fraction | None
    reason: str = ""

    @property
    def integer(self) -> int | None:
        v = self.value
        return int(v) if v is not None and v.denominator == 1 else None


# ---- tokens -----------------------------------------------------------------------------------------

_SPACE_CHARS = " \u00a0\u2007\u2008\u2009\u202f"
_SEP = rf"[,_'\u2019.]|\{{,\}}|[{_SPACE_CHARS}]|\\[,:;! ]|~"
_NUM = rf"\d++(?:(?:{_SEP})\d++)*+(?:[eE][-+]?+\d++)?+"
_VULGAR_CHARS = "\u00bc\u00bd\u00be\u2150-\u215e\u2189"
_SUPER_CHARS = "\u2070\u00b9\u00b2\u00b3\u2074-\u2079\u207a\u207b"
_TOKEN = re.compile(
    rf"(?P<num>{_NUM})|(?P<vulgar>[{_VULGAR_CHARS}])|(?P<sup>[{_SUPER_CHARS}]++)"
    r"|(?P<cmd>\\(?:[A-Za-z]++|.))|(?P<pow>\*\*|\^)|(?P<sign>[-+])|(?P<mul>[*\u00d7\u00b7\u22c5\u2219\u2217])"
    r"|(?P<slash>[/\u2215\u2044])|(?P<div>\u00f7)|(?P<open>[(\[{])|(?P<close>[)\]}])|(?P<space>\s++)"
    r"|(?P<word>[^\W\d_]++)|(?P<strike>~~)|(?P<other>.)",
    re.DOTALL,
)
_FRAC = frozenset({"frac", "dfrac", "tfrac", "cfrac"})
_WRAP = frozenset(
    {"boxed", "fbox", "text", "textbf", "textrm", "mathbf", "mathrm", "mathit", "mathsf", "mathtt", "bm"}
    | {"boldsymbol", "mbox"}
)
_LATEX_SPACE = frozenset(
    {",", ":", ";", "!", " ", "quad", "qquad", "left", "right", "displaystyle", "textstyle"}
    | {"big", "Big", "bigl", "bigr", "Bigl", "Bigr", "bigg", "Bigg", "biggl", "biggr", "Biggl", "Biggr"}
)
_LATEX_MUL = frozenset({"times", "cdot"})
_COMMAND_KINDS = (
    dict.fromkeys(_FRAC, "frac")
    | dict.fromkeys(_WRAP, "wrap")
    | dict.fromkeys(_LATEX_SPACE, "space")
    | dict.fromkeys(_LATEX_MUL, "mul")
    | {"div": "div"}
)
_FUNCTIONS = frozenset(
    {"sqrt", "log", "ln", "lg", "exp", "sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos"}
    | {"arctan", "sinh", "cosh", "tanh", "binom", "dbinom", "tbinom", "lfloor", "lceil", "max", "min"}
    | {"gcd", "lcm", "operatorname", "det", "deg", "mod", "bmod", "pmod", "overline", "bar", "vec"}
    | {"hat", "sum", "prod", "int", "lim", "not", "pm", "mp", "sim", "approx", "neg", "lnot"}
    | {"cancel", "bcancel", "xcancel", "sout", "st", "xout"}
)
# Kinds that can be part of a written value; the rest end it.
_VALUE_KINDS = frozenset(
    {"num", "vulgar", "sup", "pow", "sign", "mul", "slash", "div", "open", "close", "frac", "wrap", "space"}
)
_PAIRS = {")": "(", "]": "[", "}": "{"}
# Characters that may belong to a value, one at a time (commands and exponents apart).
_OPERATOR_CHARS = r"+\-*/^\u00d7\u00b7\u22c5\u2219\u2217\u2215\u2044\u00f7~"
_VALUE_CHARS = rf"0-9{_VULGAR_CHARS}{_SUPER_CHARS},_'\u2019.{{}}()\[\]{_OPERATOR_CHARS}\s"
_VULGAR_ANCHORS = "\u00bc\u00bd\u00be\u2189" + "".join(map(chr, range(0x2150, 0x215F)))
# From the last number leftwards, over the text reversed: `\frac` reads `carf\`, `5e3` `3e5`.
_RUN_BACK = re.compile(rf"(?:[A-Za-z]++\\|.\\|[{_VALUE_CHARS}]|[eE](?=\d))*+", re.DOTALL)
_RUN_ON = re.compile(rf"(?:\\(?:[A-Za-z]++|.)|[{_VALUE_CHARS}])*+", re.DOTALL)
_SUPER = {
    "\u2070": "0",
    "\u00b9": "1",
    "\u00b2": "2",
    "\u00b3": "3",
    "\u2074": "4",
    "\u2075": "5",
    "\u2076": "6",
    "\u2077": "7",
    "\u2078": "8",
    "\u2079": "9",
    "\u207a": "+",
    "\u207b": "-",
}


class _Tok(NamedTuple):
    kind: str
    text: str
    start: int
    end: int
    spaced: bool = False  # whitespace (or a LaTeX space) before it, inside the value


def _tokens(text: str, start: int, end: int) -> list[_Tok]:
    """The tokens of text[start:end] (positions in `text`)."""
    out: list[_Tok] = []
    for m in _TOKEN.finditer(text, start, end):
        kind = m.lastgroup or "other"
        tok = m.group(0)
        if kind == "cmd":
            kind = _COMMAND_KINDS.get(tok[1:], "cmd")
        elif kind == "other" and tok == "~":
            kind = "space"
        if kind == "num" and _splits_at_spaces(tok):
            out.extend(_split_num(tok, m.start()))
            continue
        out.append(_Tok(kind, tok, m.start(), m.end()))
    return out


_SEP_RUN = re.compile(_SEP)
_SPACE_SEP = re.compile(rf"[{_SPACE_CHARS}]|\\[,:;! ]|~")
_DIGITS = re.compile(r"\d++")
_EXPONENT = re.compile(r"[eE]([-+]?+\d++)$")


def _splits_at_spaces(num: str) -> bool:
    """Digits apart by spaces that are not thousands groups: separate numbers (`12 34`)."""
    body = _exp_split(num)[0]
    seps = {_kind(s) for s in _SEP_RUN.findall(body)}
    if seps - {" ", "."} or " " not in seps:
        return False
    whole = body.split(".")[0] if seps == {" ", "."} else body
    groups = _SPACE_SEP.split(whole)
    return not _grouped(groups)


def _split_num(num: str, offset: int) -> list[_Tok]:
    """A number token cut at its spaces: the numbers written apart."""
    toks: list[_Tok] = []
    pos = 0
    for m in _SPACE_SEP.finditer(num):
        toks.append(_Tok("num", num[pos : m.start()], offset + pos, offset + m.start(), spaced=bool(toks)))
        pos = m.end()
    toks.append(_Tok("num", num[pos:], offset + pos, offset + len(num), spaced=bool(toks)))
    return toks


def _grouped(groups: list[str]) -> bool:
    return 1 <= len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:])


def _kind(sep: str) -> str:
    if sep in (",", "{,}"):
        return ","
    if sep in ("'", "\u2019"):
        return "'"
    if sep in (".", "_"):
        return sep
    return " "


# ---- values -----------------------------------------------------------------------------------------

_BIG = 10**MAX_DIGITS


def _bounded(v: Fraction) -> Fraction:
    if abs(v.numerator) > _BIG or v.denominator > _BIG:
        raise Refused(f"the value needs more than {MAX_DIGITS} digits: not evaluated")
    return v


def number_value(text: str) -> Fraction:
    """The exact value of one written number (`1,000.5`, `5e3`, `1_000`); Refused with the reason
    when its separators cannot be read without guessing."""
    if text.isascii() and text.isdigit():  # the common case: one run of digits
        if len(text) > MAX_DIGITS:
            raise Refused(f"the number has more than {MAX_DIGITS} digits: not evaluated")
        return Fraction(int(text))
    mantissa, exponent = _exp_split(text)
    seps = [_kind(s) for s in _SEP_RUN.findall(mantissa)]
    groups = _DIGITS.findall(mantissa)
    kinds = set(seps) - {"."}
    if seps.count(".") > 1:
        raise Refused(f"{text[:24]!r} has more than one '.' (a version, or dots as thousands separators?)")
    if "." in seps and seps[-1] != ".":
        raise Refused(f"the last number mixes separators ({text[:24]!r}: a decimal comma?)")
    if len(kinds) > 1:
        raise Refused(f"the last number mixes separators ({text[:24]!r}): not read as a number")
    whole = groups[:-1] if "." in seps else groups
    if kinds and not _grouped(whole):
        which = {",": "comma", "_": "underscore", "'": "apostrophe", " ": "space"}[kinds.pop()]
        raise Refused(
            f"the last number's {which} is not a thousands separator ({text[:24]!r}: a decimal "
            "comma, or a list?): not read as a number"
        )
    digits = "".join(whole)
    fraction = groups[-1] if "." in seps else ""
    if len(digits) + len(fraction) > MAX_DIGITS:
        raise Refused(f"the number has more than {MAX_DIGITS} digits: not evaluated")
    power = int(exponent) if exponent else 0
    if abs(power) > MAX_DIGITS:
        raise Refused(f"the exponent of {text[:24]!r} is beyond {MAX_DIGITS}: not evaluated")
    value = Fraction(int(digits + fraction), 10 ** len(fraction))
    return _bounded(value * Fraction(10) ** power if power else value)


def _exp_split(text: str) -> tuple[str, str]:
    """(mantissa, exponent) of a written number (`5e3`: `5`, `3`; `5`: `5`, ``)."""
    m = _EXPONENT.search(text)
    return (text[: m.start()], m.group(1)) if m else (text, "")


class _Parser:
    """The grammar of the module docstring over one value's tokens (spaces dropped, `spaced` set)."""

    def __init__(self, toks: list[_Tok], source: str) -> None:
        self.toks = toks
        self.source = source
        self.i = 0
        self.depth = 0

    def peek(self, offset: int = 0) -> _Tok | None:
        j = self.i + offset
        return self.toks[j] if j < len(self.toks) else None

    def take(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def written(self, first: int, last: int) -> str:
        return self.source[self.toks[first].start : self.toks[last].end]

    def last_value(self) -> Fraction:
        """The values written one after another (`1 2 3`); the last is the answer."""
        value = self.value()
        while self.peek() is not None:
            tok = self.peek()
            assert tok is not None
            if tok.kind in ("sign", "mul", "div", "slash", "pow"):
                raise Refused(
                    f"the final answer is an expression ({self.written(0, len(self.toks) - 1)[:40]!r}), "
                    "not one value: not evaluated"
                )
            if not tok.spaced:
                raise Refused(
                    f"the final answer is an implicit product "
                    f"({self.written(0, len(self.toks) - 1)[:40]!r}): not one value"
                )
            value = self.value()
        return value

    def value(self) -> Fraction:
        tok = self.peek()
        negative = False
        if tok is not None and tok.kind == "sign":
            self.take()
            negative = tok.text == "-"
            after = self.peek()
            if after is not None and after.kind == "sign":
                raise Refused("the final answer has two signs: not read as a number")
            earlier, _, line = self.source[: tok.start].rpartition("\n")
            if (
                tok.text == "-"
                and after is not None
                and after.spaced
                and not line.strip()
                and earlier.strip()
            ):
                raise Refused(
                    "`- ` opens a line after others: a list bullet or a minus? not read as a number"
                )
        v = self.mixed_or_ratio()
        return -v if negative else v

    def mixed_or_ratio(self) -> Fraction:
        tok, nxt = self.peek(), self.peek(1)
        if tok is not None and tok.kind == "num" and nxt is not None and nxt.kind in ("vulgar", "frac"):
            whole = number_value(tok.text)
            if whole.denominator == 1 and re.fullmatch(r"[\d,_'\u2019 ]+", tok.text):
                self.take()
                part = self.atom()
                if not 0 < part < 1:
                    raise Refused("a whole number followed by a fraction that is not proper: not one value")
                return whole + part
        return self.ratio()

    def ratio(self) -> Fraction:
        top, _ = self.product()
        tok = self.peek()
        if tok is None or tok.kind != "slash":
            return top
        self.take()
        bottom, _ = self.product()
        if self.peek() is not None and self.peek().kind == "slash":  # type: ignore[union-attr]
            raise Refused("`a/b/c` is ambiguous: not read as one value")
        if bottom == 0:
            raise Refused("the final answer divides by zero")
        return _bounded(top / bottom)

    def product(self) -> tuple[Fraction, bool]:
        first = self.i
        left, ten = self.power()
        tok = self.peek()
        if tok is None or tok.kind != "mul":
            return left, ten
        plain = self.i == first + 1 and self.toks[first].kind == "num"  # a mantissa: one number
        self.take()
        right, right_ten = self.power()
        if not right_ten or not plain:
            raise Refused(
                f"a product ({self.written(first, self.i - 1)[:40]!r}) is an expression, not one value "
                "(only scientific notation, `5\\times10^{3}`, is read)"
            )
        return _bounded(left * right), False

    def power(self) -> tuple[Fraction, bool]:
        """(value, whether it is 10 raised to an exponent: the right side of scientific notation)."""
        first = self.peek()
        base = self.atom()
        tok = self.peek()
        if tok is None or tok.kind not in ("pow", "sup") or (tok.spaced and tok.kind == "sup"):
            return base, False
        self.take()
        if tok.kind == "sup":
            exponent = _superscript(tok.text)
        else:
            exponent = self.exponent()
        after = self.peek()
        if after is not None and after.kind in ("pow", "sup") and not after.spaced:
            raise Refused("chained powers (`2^3^2`) are ambiguous: not read as one value")
        ten = first is not None and first.kind == "num" and first.text == "10"
        return _power(base, exponent), ten

    def exponent(self) -> Fraction:
        tok = self.peek()
        if tok is None:
            raise Refused("a power without an exponent: not read as one value")
        if tok.kind == "open" and tok.text == "{":
            return self.atom()
        negative = False
        if tok.kind == "sign":
            self.take()
            negative = tok.text == "-"
            tok = self.peek()
        if tok is None or tok.kind not in ("num", "open"):
            raise Refused("a power without an exponent: not read as one value")
        v = self.atom()
        return -v if negative else v

    def atom(self) -> Fraction:
        tok = self.peek()
        if tok is None:
            raise Refused("the final answer ends with an operator: not read as one value")
        if tok.kind == "num":
            self.take()
            return number_value(tok.text)
        if tok.kind == "vulgar":
            self.take()
            return Fraction(unicodedata.numeric(tok.text)).limit_denominator(12)
        if tok.kind == "open":
            return self.group()
        if tok.kind == "wrap":
            self.take()
            nxt = self.peek()
            if nxt is None or nxt.text != "{":
                raise Refused(f"`{tok.text}` without its braces: not read as one value")
            return self.group()
        if tok.kind == "frac":
            self.take()
            nxt = self.peek()
            if nxt is not None and nxt.kind == "num" and re.fullmatch(r"\d\d", nxt.text):
                self.take()  # \frac12
                top, bottom = Fraction(int(nxt.text[0])), Fraction(int(nxt.text[1]))
            else:
                top, bottom = self.frac_argument(), self.frac_argument()
            if bottom == 0:
                raise Refused("the final answer divides by zero")
            return _bounded(top / bottom)
        raise Refused(f"{tok.text[:20]!r} cannot start a value: not read as one value")

    def frac_argument(self) -> Fraction:
        tok = self.peek()
        if tok is not None and tok.text == "{":
            return self.group()
        if tok is not None and tok.kind == "num" and re.fullmatch(r"\d", tok.text):
            self.take()
            return Fraction(int(tok.text))
        raise Refused("`\\frac` without two arguments: not read as one value")

    def group(self) -> Fraction:
        opener = self.take()
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise Refused(f"brackets nested deeper than {_MAX_DEPTH}: not read")
        v = self.value()
        tok = self.peek()
        if tok is None or tok.kind != "close" or _PAIRS[tok.text] != opener.text:
            raise Refused(
                f"the final answer is an expression ({self.written(0, len(self.toks) - 1)[:40]!r}), "
                "not one value: not evaluated"
            )
        self.take()
        self.depth -= 1
        return v


def _superscript(text: str) -> Fraction:
    written = "".join(_SUPER[c] for c in text)
    if not re.fullmatch(r"[-+]?\d+", written):
        raise Refused(f"the superscript {text!r} is not an exponent: not read as one value")
    return Fraction(int(written))


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise Refused("a fractional power is a root: not read as one value")
    n = int(exponent)
    if base == 0 and n < 0:
        raise Refused("the final answer divides by zero")
    if base in (0, 1) or n == 0:
        return Fraction(1) if n == 0 else base
    if base == -1:
        return Fraction(1 if n % 2 == 0 else -1)
    size = max(abs(base.numerator), base.denominator).bit_length() * 0.302
    if abs(n) > MAX_DIGITS * 4 or abs(n) * size > MAX_DIGITS:
        raise Refused(f"the value needs more than {MAX_DIGITS} digits: not evaluated")
    return _bounded(base**n)


# ---- the final answer -------------------------------------------------------------------------------

_ROOT_BEFORE = re.compile(r"(?:[√∛∜]|\\sqrt(?:\[[^\]]{0,8}\])?|sqrt|cbrt|(?i:root\s++of))\s*+$")
# Words right before the value that make it a sign, an operand or a negation (`minus 5`, `10 over
# 2`, `not 5`): read alone the value would be another number than the one written. The full reading
# refuses a value after one (_WORD_BEFORE); plain_digits leaves such a text to it (_WORDS_REFUSED).
_WORDS_BEFORE = ("minus", "negative", "plus", "times", "over", "not", "divided by", "multiplied by")
_WORD_BEFORE = re.compile(
    r"(?<![A-Za-z])(?i:(" + "|".join(w.replace(" ", r"\s++") for w in _WORDS_BEFORE) + r"))[\s*$]++$"
)
_NOT_EQUAL_BEFORE = re.compile(r"(?:!=|≠|\\neq?)[\s*$]*+$")  # `x != 5`, `x ≠ 5`, `x \neq 5`
_POWER_WORD_AFTER = re.compile(r"\s*+(?i:squared|cubed)\b")
_PERCENT_AFTER = re.compile(r"\s*+(?:%|\\%|‰|‱|(?i:per\s*+(?:cent|mille)|percent)\b)")
_FACTORIAL_AFTER = re.compile(r"!(?!=)")
_COMMAND_BEFORE = re.compile(r"\\([A-Za-z]++)\s*+$")
_GLUED = re.compile(r"[A-Za-z0-9_\u0370-\u03ff]")
_MARKS = frozenset({"Mn", "Me", "No"})  # combining marks; subscripts, circled digits ...
_BASE_PREFIX = re.compile(r"0[xXbBoO][0-9A-Fa-f]")
_BASE_PREFIX_BEFORE = re.compile(r"(?<![\w.])0[xXbBoO][0-9A-Fa-f]*+$")


def final_answer(text: str) -> Reading | None:
    """The final answer of `text` read as one value; None when its last WINDOW characters hold no
    number. The common case (plain_digits) is read without the full reading (read_final_answer),
    which gives the same Reading for it."""
    digits = plain_digits(text)
    if digits is not None:
        return Reading(digits, Fraction(int(digits)))
    return read_final_answer(text)


# ---- the common case ---------------------------------------------------------------------------------

_PLAIN_AROUND = 64  # at most this many digits, and spaces on either side of the lead, in the common case
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_TEXT_END = " \t\n\r"
_LEAD_SPACE = " \n"
# `sqrt 25`, `root of 25`, `minus 25`, `divided by 25`, `not 25` ...: the full reading refuses them
_WORDS_REFUSED = ("sqrt", "cbrt", "of", *dict.fromkeys(w.split()[-1] for w in _WORDS_BEFORE))


def plain_digits(text: str) -> str | None:
    """The digits of `text`'s final answer when it is written plainly, else None (read_final_answer
    reads it whole). Plainly: the last WINDOW characters are ASCII and end with

        (start | word spaces | (`:` | `=`) [spaces]) [`**` | `$`] digits [`**` | `$`] [`.`] [spaces]

    (`The answer is 68.`, `Answer: **68**`, `x = $68$`, `68`), where a lead without `**` or `$`
    has spaces after a word, no backslash or digit is right before the word (`\\times 68`, `0x 68`)
    and no backslash before `:` (`\\:` is a LaTeX space) nor `!` before `=` (`!=`), the word does
    not end in one the full reading refuses a value after (_WORDS_REFUSED: `root of 68`, `minus
    68`), the digits are not struck through, each run of digits or spaces is at most _PLAIN_AROUND
    long, and a text longer than WINDOW has something before the digits. For these the
    full reading gives a value of just those digits with nothing around it that refuses it (every
    character next to them ends a value or is trimmed from its ends): the environment's
    tests/test_plain_digits.py compares the two over every test payload and a generated corpus. A
    few str methods: about a fifth of the full reading's cost."""
    tail = text[-WINDOW:]
    if not tail.isascii():
        return None
    e = len(tail.rstrip(_TEXT_END))
    if len(tail) - e > _PLAIN_AROUND:
        return None
    if e and tail[e - 1] == ".":
        e -= 1
    if tail.endswith("**", 0, e):
        e -= 2
    elif e and tail[e - 1] == "$":
        e -= 1
    s = len(tail[:e].rstrip("0123456789"))
    if not 0 < e - s <= _PLAIN_AROUND:
        return None
    lead = s
    if tail.endswith("**", 0, lead):
        lead -= 2
    elif lead and tail[lead - 1] == "$":
        lead -= 1
    i = len(tail[:lead].rstrip(_LEAD_SPACE))
    if lead - i > _PLAIN_AROUND:
        return None
    if i == 0:  # nothing before: the reading's window is the whole text
        if len(text) > WINDOW:
            return None
    elif tail[i - 1] in ":=":
        if i > 1 and tail[i - 2] in "\\!":  # `\:` is a LaTeX space, part of a value; `!=`
            return None
    elif tail[i - 1] in _LETTERS:
        if i == lead == s:  # `x68`: a number glued to a word
            return None
        w = len(tail[:i].rstrip(_LETTERS))
        if (w and tail[w - 1] in "\\0123456789") or tail[w:i].lower().endswith(_WORDS_REFUSED):
            return None  # `\times 68` (a LaTeX command), `0x 68` (a base prefix), `sqrt 68`, `not 68`
    else:
        return None
    if struck(tail, s):
        return None
    return tail[s:e]


def read_final_answer(text: str) -> Reading | None:
    """final_answer's full reading (the module docstring), for any text."""
    tail = text[-WINDOW:]
    folded, where = fold_with_positions(tail)
    at = max(map(folded.rfind, "0123456789"))
    if not folded.isascii():
        at = max(at, *map(folded.rfind, _VULGAR_ANCHORS))
    if at < 0:
        return None
    # The stretch of characters that can belong to a value around the last number (C-speed scans),
    # at most VALUE_CHARS on either side; only it is cut into tokens.
    lo = max(0, at - VALUE_CHARS)
    left = at - len(_RUN_BACK.match(folded[lo : at + 1][::-1]).group(0)) + 1  # type: ignore[union-attr]
    right = _RUN_ON.match(folded, at + 1, at + 1 + VALUE_CHARS).end()  # type: ignore[union-attr]
    toks = _tokens(folded, left, right)
    anchors = [i for i, t in enumerate(toks) if t.kind in ("num", "vulgar")]
    if not anchors:  # the last digit is a LaTeX control symbol (`\5`), the only one in the stretch
        cmd = next(t for t in toks if t.start <= at < t.end)
        written = tail[where[cmd.start] : where[at] + 1] if where else tail[cmd.start : at + 1]
        return Reading(written, None, f"the last digit is part of a LaTeX command ({cmd.text!r}): not read")
    anchor = anchors[-1]
    first, last, cut_left, cut_right = _span(toks, anchor)
    start, end = toks[first].start, toks[last].end
    written = (tail[where[start] : where[end - 1] + 1] if where else tail[start:end]).strip()
    # A stretch that reached its bound may hold only part of the value: its first (last) token may
    # be cut, and a bracket without its partner may have it beyond the bound.
    capped_left = left == lo and (lo > 0 or len(text) > WINDOW)
    capped_right = right == at + 1 + VALUE_CHARS
    try:
        if (capped_left and (first <= 1 or cut_left)) or (
            capped_right and (last >= len(toks) - 2 or cut_right)
        ):
            raise Refused(f"the final answer is longer than {VALUE_CHARS} characters: not read")
        _around(folded, start, end, toks[first])
        value = _Parser(_spaced(toks[first : last + 1]), folded).last_value()
    except Refused as exc:
        return Reading(written, None, str(exc))
    return Reading(written, value, "" if value.denominator == 1 else NOT_INTEGER)


def _span(toks: list[_Tok], anchor: int) -> tuple[int, int, bool, bool]:
    """The first and last token of the value holding toks[anchor] (module docstring), and whether a
    closing bracket left of it (an opening one right of it) was cut off for lack of its partner."""
    first = anchor
    while first > 0 and toks[first - 1].kind in _VALUE_KINDS:
        first -= 1
    last = anchor
    while last + 1 < len(toks) and toks[last + 1].kind in _VALUE_KINDS:
        last += 1
    # Brackets without their partner inside the span are outside the value.
    stack: list[int] = []
    unmatched: list[int] = []
    for j in range(first, last + 1):
        t = toks[j]
        if t.kind == "open":
            stack.append(j)
        elif t.kind == "close":
            if stack and toks[stack[-1]].text == _PAIRS[t.text]:
                stack.pop()
            else:
                unmatched.append(j)
    unmatched.extend(stack)
    cut_left = any(j < anchor and toks[j].kind == "close" for j in unmatched)
    cut_right = any(j > anchor and toks[j].kind == "open" for j in unmatched)
    for j in unmatched:
        if j < anchor:
            first = max(first, j + 1)
        else:
            last = min(last, j - 1)
    # A wrapper or fraction command whose brace was cut off, spaces and markdown `*` at the ends.
    while first < anchor and (
        toks[first].kind == "close"
        or (toks[first].kind == "space" and not toks[first].text.startswith("\\"))
        or toks[first].text in ("*", "**")
        or (toks[first].kind == "wrap" and toks[first + 1].text != "{")
    ):
        first += 1
    while last > anchor and (
        toks[last].kind in ("space", "open", "wrap", "frac") or toks[last].text in ("*", "**")
    ):
        last -= 1
    return first, last, cut_left, cut_right


def _spaced(toks: list[_Tok]) -> list[_Tok]:
    out: list[_Tok] = []
    gap = False
    for t in toks:
        if t.kind == "space":
            gap = True
            continue
        out.append(_Tok(t.kind, t.text, t.start, t.end, spaced=gap or t.spaced))
        gap = False
    return out


def _around(text: str, start: int, end: int, first: _Tok) -> None:
    """Refuse a value whose surroundings change what it is (module docstring)."""
    before, after = text[max(0, start - 32) : start], text[end : end + 32]
    if _ROOT_BEFORE.search(before):
        raise Refused("the last number is under a root (`√25`): not read as a number")
    if _NOT_EQUAL_BEFORE.search(before):
        raise Refused("the last number follows `≠` (`x ≠ 5`): what the answer is not, not read as it")
    word = _WORD_BEFORE.search(before)
    if word:
        raise Refused(
            f"the last number follows {' '.join(word.group(1).split())!r} (a sign, an operation or a "
            "negation in words: `minus 5`, `10 over 2`, `not 5`): not read as a number"
        )
    if _FACTORIAL_AFTER.match(after):
        raise Refused("the last number is a factorial (`5!`): not read as a number")
    if _POWER_WORD_AFTER.match(after):
        raise Refused("the last number is raised to a power (`5 squared`): not read as a number")
    if _PERCENT_AFTER.match(after):
        raise Refused("the last number is a percentage or per mille (`5%`): not read as a number")
    if before.endswith(("±", "∓")) or before.rstrip().endswith(("±", "∓")):
        raise Refused("`±` gives two values: not read as one")
    command = _COMMAND_BEFORE.search(before)
    if command and command.group(1) in _FUNCTIONS | {"pm", "mp"}:
        raise Refused(f"the last number is an argument of `\\{command.group(1)}`: not read as a number")
    if struck(text, start):
        raise Refused("the last number is struck through (`~~5~~`, `<del>5</del>`): not read as a number")
    if (before and unicodedata.category(before[-1]) in _MARKS) or (
        after and unicodedata.category(after[0]) in _MARKS
    ):
        raise Refused("the last number carries a combining mark or a number sign (`5̶`, `5₀`): not read")
    if before.endswith("\u2014") or before.endswith("\u2015"):
        raise Refused("an em dash before the number: a minus or a dash? not read as a number")
    if _BASE_PREFIX.match(text, start) or _BASE_PREFIX_BEFORE.search(before):
        raise Refused("a base prefix (`0x10`): not read as a decimal number")
    if before and _GLUED.match(before[-1]) and not first.text.startswith("\\"):
        raise Refused(f"the last number is part of a word ({(before[-8:] + text[start:end])[-24:]!r})")
    if after and _GLUED.match(after[0]):
        raise Refused(f"the last number runs into a word ({text[start:end][-12:] + after[:8]!r})")
