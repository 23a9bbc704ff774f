"""JSON that someone else wrote (a dataset row, a results file, a model's tool arguments, a task):
`loads(text)` refuses it in every way json.loads can, as one `NotJson` (a ValueError) whose message
says why in a phrase.

json.loads raises JSONDecodeError for bad syntax, but a plain ValueError for a number past Python's
int digit limit (4300 digits) and RecursionError for nesting past the interpreter's recursion limit:
a caller that caught only JSONDecodeError let those two through as internal errors. An escaped lone
UTF-16 surrogate ("\\ud800") parses to a str that no UTF-8 writer (protobuf, a response, a file) can
encode: refused here, so it fails as the caller's bad input instead of wherever it is written.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from rollmesh.mesh.errors import NotJson

_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")  # an escape that may leave a lone one: checked then
_SURROGATE_BYTES = re.compile(_SURROGATE.pattern.encode())


def loads(text: str | bytes) -> Any:
    try:
        data = json.loads(text)
        if (_SURROGATE_BYTES if isinstance(text, bytes) else _SURROGATE).search(text):  # type: ignore[arg-type]
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        return data
    except UnicodeEncodeError:
        raise NotJson("a string holds a lone UTF-16 surrogate (not Unicode text)") from None
    except json.JSONDecodeError as exc:
        where = f"column {exc.colno}" if exc.lineno == 1 else f"line {exc.lineno} column {exc.colno}"
        # removesuffix: "Unterminated string starting at" would read "... at at column 9".
        raise NotJson(f"{exc.msg.removesuffix(' at')} at {where}") from None
    except RecursionError:
        raise NotJson("nested too deeply") from None
    except ValueError:  # int("...") past the digit limit
        raise NotJson(f"a number has more than {sys.get_int_max_str_digits()} digits") from None
