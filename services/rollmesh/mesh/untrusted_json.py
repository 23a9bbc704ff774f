"""JSON that someone else wrote (a dataset row, a results file, a model's tool arguments, a task):
`loads(text)` refuses it in every way json.loads can, as one `NotJson` (a ValueError) whose message
says why in a phrase.

json.loads raises JSONDecodeError for bad syntax, but a plain ValueError for a number past Python's
int digit limit (4300 digits) and RecursionError for nesting past the interpreter's recursion limit:
a caller that caught only JSONDecodeError let those two through as internal errors.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rollmesh.mesh.errors import NotJson


def loads(text: str | bytes) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"column {exc.colno}" if exc.lineno == 1 else f"line {exc.lineno} column {exc.colno}"
        # removesuffix: "Unterminated string starting at" would read "... at at column 9".
        raise NotJson(f"{exc.msg.removesuffix(' at')} at {where}") from None
    except RecursionError:
        raise NotJson("nested too deeply") from None
    except ValueError:  # int("...") past the digit limit
        raise NotJson(f"a number has more than {sys.get_int_max_str_digits()} digits") from None
