"""Proto <-> dataclass conversion by field name: the part of every `convert.py` that only copies.

A service's domain dataclass and its proto message mostly share field names; each `convert.py`
names only the fields that differ (renamed, reshaped, serialized) and lets these two copy the rest.

- `to_pb(message_class, obj, **given)` builds a message. Each proto field takes `given[name]` when
  given (`None` there leaves it unset), else `getattr(obj, name)` when `obj` has that attribute
  (properties count), else stays at its proto default. A value for a message field that is a
  dataclass (or a sequence of them, for a repeated one) is converted into the field's message
  type by the same rule; anything else is handed to the message constructor as is, so a value of
  the wrong type raises `TypeError` there instead of being coerced.
- `from_pb(dataclass_type, msg, **given)` builds a dataclass. Each dataclass field takes
  `given[name]` when given, else the proto field of that name when it is a scalar (a set one, for
  a field with presence), a repeated scalar (a tuple when the dataclass field defaults to a tuple,
  else a list) or a map (a dict). Message fields, unset optional fields and names the proto lacks
  keep the dataclass default: a required dataclass field of that kind must be given.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import operator
from collections.abc import Callable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeVar

from google.protobuf import message_factory
from google.protobuf.message import Message

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

M = TypeVar("M", bound=Message)
D = TypeVar("D", bound="DataclassInstance")
# protobuf's `Descriptor` / `FieldDescriptor`, or their upb twins (the stubs type DESCRIPTOR as either).
Descriptor = Any
FieldDescriptor = Any


def to_pb(message_class: type[M], obj: object, /, **given: Any) -> M:
    """A `message_class` from `obj`'s same-named attributes, overridden by `given` (module docstring)."""
    return message_class(**_pb_values(message_class.DESCRIPTOR, obj, given))


def from_pb(dataclass_type: type[D], msg: Message, /, **given: Any) -> D:
    """A `dataclass_type` from `msg`'s same-named scalar, repeated and map fields, overridden by `given`."""
    p = _from_plan(dataclass_type, msg.DESCRIPTOR, tuple(given))
    values = {name: given[name] for name in p.given}
    if p.scalars:
        values.update(zip(p.scalars, p.get_scalars(msg), strict=True))
    for name in p.presence:
        if msg.HasField(name):
            values[name] = getattr(msg, name)
    for name in p.maps:
        values[name] = dict(getattr(msg, name))
    for name in p.tuples:
        values[name] = tuple(getattr(msg, name))
    for name in p.lists:
        values[name] = getattr(msg, name)[:]  # a list; list() of one iterates to an IndexError
    return dataclass_type(**values)


@dataclasses.dataclass(frozen=True)
class _FromPlan:
    """`from_pb`'s work for one dataclass, message type and set of given names, by kind of field."""

    given: tuple[str, ...]  # the given names that are fields (others are ignored)
    scalars: tuple[str, ...]
    get_scalars: Callable[[Any], tuple[Any, ...]]  # the scalars' values, in that order
    presence: tuple[str, ...]
    maps: tuple[str, ...]
    tuples: tuple[str, ...]
    lists: tuple[str, ...]


@functools.cache
def _from_plan(dataclass_type: Any, descriptor: Descriptor, given: tuple[str, ...]) -> _FromPlan:
    """Worked out once per dataclass, message type and given names: the conversions run on every
    model turn and verify."""
    by_kind: dict[_Copy, list[str]] = {kind: [] for kind in _Copy}
    kept: list[str] = []
    for name, kind in _copy_plan(dataclass_type, descriptor):
        if name in given:
            kept.append(name)
        else:
            by_kind[kind].append(name)
    scalars = tuple(by_kind[_Copy.SCALAR])
    getter = operator.attrgetter(*scalars) if scalars else (lambda msg: ())
    return _FromPlan(
        given=tuple(kept),
        scalars=scalars,
        get_scalars=getter if len(scalars) != 1 else (lambda msg: (getter(msg),)),
        presence=tuple(by_kind[_Copy.PRESENCE]),
        maps=tuple(by_kind[_Copy.MAP]),
        tuples=tuple(by_kind[_Copy.TUPLE]),
        lists=tuple(by_kind[_Copy.LIST]),
    )


class _Copy(enum.Enum):
    """How `from_pb` fills a dataclass field from the proto field of its name."""

    KEEP = "keep"  # no such proto field, or a message field: the dataclass default, unless given
    SCALAR = "scalar"
    PRESENCE = "presence"  # a scalar with presence: copied only when set
    MAP = "map"
    TUPLE = "tuple"  # repeated, into a field that defaults to a tuple
    LIST = "list"  # repeated, into any other field


@functools.cache
def _copy_plan(dataclass_type: type[Any], descriptor: Descriptor) -> tuple[tuple[str, _Copy], ...]:
    """Per dataclass field, how `from_pb` fills it (worked out once per dataclass and message type:
    the conversions run on every model turn and verify)."""
    by_name = descriptor.fields_by_name
    return tuple((f.name, _copy_kind(f, by_name.get(f.name))) for f in dataclasses.fields(dataclass_type))


def _copy_kind(f: dataclasses.Field[Any], fd: FieldDescriptor | None) -> _Copy:
    if fd is None:
        return _Copy.KEEP
    if _is_map(fd):
        return _Copy.MAP
    if fd.message_type is not None:
        return _Copy.KEEP
    if fd.is_repeated:
        return _Copy.TUPLE if isinstance(_default(f), tuple) else _Copy.LIST
    return _Copy.PRESENCE if fd.has_presence else _Copy.SCALAR


def _pb_values(descriptor: Descriptor, obj: object, given: Mapping[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, nested, repeated in _plan(descriptor):
        value = given[name] if name in given else getattr(obj, name, None)
        if value is None:
            continue
        values[name] = value if nested is None else _nested(nested, value, repeated=repeated)
    return values


@functools.cache
def _plan(descriptor: Descriptor) -> tuple[tuple[str, Descriptor | None, bool], ...]:
    """Per field: its name, its message type when values may need converting (not maps), repeated."""
    return tuple(
        (fd.name, None if fd.message_type is None or _is_map(fd) else fd.message_type, fd.is_repeated)
        for fd in descriptor.fields
    )


@functools.cache
def _message_class(descriptor: Descriptor) -> Any:
    return message_factory.GetMessageClass(descriptor)


def _nested(descriptor: Descriptor, value: Any, *, repeated: bool) -> Any:
    """Dataclass values for a message field as messages of its type; other values unchanged."""

    def one(item: Any) -> Any:
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            return _message_class(descriptor)(**_pb_values(descriptor, item, {}))
        return item

    return [one(item) for item in value] if repeated else one(value)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _is_map(fd: FieldDescriptor) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry
