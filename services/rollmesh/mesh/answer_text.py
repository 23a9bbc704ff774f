"""The characters of a written answer, folded to the few that answer checkers read (issue 38).

`fold(text)` is `text` with, character for character:
- invisible formatting characters (Unicode category Cf: zero-width space, non-joiner and joiner,
  word joiner, byte order mark, soft hyphen, bidirectional marks, tags) removed: `5<U+200B>0` is
  `50`; the invisible operators are made visible (U+2062 invisible times `×`, U+2063 invisible
  separator `,`, U+2064 invisible plus `+`; U+2061 function application removed), so
  `5<U+2064>0` is the expression `5+0`, never `0`;
- every Unicode decimal digit (fullwidth `３`, Arabic-Indic `٣`, Devanagari `३`, ...) as its ASCII
  digit, and the fullwidth ASCII forms (`＋`, `（`, `／`, `ｅ`) as their ASCII character;
- the minus sign U+2212, the small and fullwidth hyphen-minus, the hyphen, non-breaking hyphen,
  figure dash and en dash as `-`: `–5` and `−5` are `-5`. The em dash stays (a dash in prose, not a
  sign); superscript digits and vulgar fractions stay (they are not the digits they show: `2³` is
  not `23`, `2½` not `21`).
`last_box(text)` finds the last `\boxed{…}` (or `\fbox{…}`) whose braces close, nested braces matched;
`struck(text, pos)` says whether `pos` is inside a strikethrough (`~~…~~`, `<del>`, `<s>`, `<strike>`);
`outside_think(text)` is the text without its think blocks (what every text checker reads).

`fold_with_positions` also gives, for each character of the folded text, its index in `text`, so a
checker can show what was written. One `str.translate` (each character folded once per process and
remembered): cost linear in the text, at C speed.
"""

from __future__ import annotations

import re
import unicodedata

_INVISIBLE_OPERATORS = {"\u2061": "", "\u2062": "\u00d7", "\u2063": ",", "\u2064": "+"}
_MINUS = frozenset("\u2212\ufe63\uff0d\u2010\u2011\u2012\u2013")


def _fold_char(ch: str) -> str:
    """The folded character ("" when it is removed)."""
    if ch.isascii():
        return ch
    if ch in _MINUS:
        return "-"
    if "\uff01" <= ch <= "\uff5e":  # fullwidth ASCII forms
        return chr(ord(ch) - 0xFEE0)
    category = unicodedata.category(ch)
    if category == "Nd":
        return str(unicodedata.decimal(ch))
    if category == "Cf":
        return _INVISIBLE_OPERATORS.get(ch, "")
    return ch


class _Table(dict[int, str | None]):
    """str.translate's table, filled on first sight of each character (a bounded cache)."""

    def __missing__(self, code: int) -> str | None:
        folded = _fold_char(chr(code)) or None
        if len(self) < 65536:
            self[code] = folded
        return folded


_TABLE = _Table()


def fold(text: str) -> str:
    """`text` with its characters folded (module docstring)."""
    return text if text.isascii() else text.translate(_TABLE)


def fold_with_positions(text: str) -> tuple[str, list[int] | None]:
    """The folded text and, for each of its characters, the index of the character it came from in
    `text` (None when that is its own index: no character was removed)."""
    folded = fold(text)
    if len(folded) == len(text):
        return folded, None
    where = [i for i, ch in enumerate(text) if ch.isascii() or _TABLE[ord(ch)] is not None]
    return folded, where


_BOX = re.compile(r"\\(?:boxed|fbox)\s*+\{")
_BRACE = re.compile(r"[{}]")


def last_box(text: str) -> tuple[int, int, int] | None:
    """(where `\\boxed` starts, where its content starts, where its closing brace is) of the last box
    whose braces close; None when there is none. At most two passes over the braces of the text's
    last 100,000 characters (each brace matched once), however many boxes it opens."""
    offset = max(0, len(text) - 100_000)
    tail = text[offset:]
    boxes = list(_BOX.finditer(tail))
    if not boxes:
        return None
    # The last box's closing brace is the first one after it that closes as many as opened since
    # (the braces before it are deeper in the one pass's stack): usually all that is read.
    depth = 0
    for m in _BRACE.finditer(tail, boxes[-1].end() - 1):
        depth += 1 if m.group() == "{" else -1
        if depth == 0:
            return boxes[-1].start() + offset, boxes[-1].end() + offset, m.start() + offset
    closes: dict[int, int] = {}
    opened: list[int] = []
    for m in _BRACE.finditer(tail):  # the braces only
        if m.group() == "{":
            opened.append(m.start())
        elif opened:
            closes[opened.pop()] = m.start()
    for m in reversed(boxes):
        close = closes.get(m.end() - 1)
        if close is not None:
            return m.start() + offset, m.end() + offset, close + offset
    return None


_STRIKE = re.compile(r"~~|<(/?)(?i:del|s|strike)>")


def struck(text: str, pos: int) -> bool:
    """Whether `pos` is inside a strikethrough that opens before it (markdown `~~`, HTML `<del>`,
    `<s>`, `<strike>`), within the 2,000 characters before it: what the writer struck out is not
    their answer."""
    tilde = tag = False
    for m in _STRIKE.finditer(text, max(0, pos - 2000), pos):
        if m.group(0) == "~~":
            tilde = not tilde
        else:
            tag = not m.group(1)
    return tilde or tag


_THINK_OPEN = re.compile(r"<think(?:ing)?>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think(?:ing)?>", re.IGNORECASE)


def outside_think(text: str) -> str:
    """`text` without its think blocks (`<think>…</think>`, `<thinking>…</thinking>`, any case):
    what follows the last closing tag (a lone `</think>` closes thinking the prompt opened), up to
    an opening tag that is never closed. What a model only thought is not its answer."""
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:
        text = text[closes[-1].end() :]
    opened = _THINK_OPEN.search(text)
    return text[: opened.start()] if opened else text
