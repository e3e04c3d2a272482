"""The encoding of what one shard hands another (a link's frames,
amqp_server.shards.link; a moving connection's state, amqp_server.shards.moves):
msgpack, which builds only its own values (None, bool, int, float, str,
bytes, list, dict, and an aware datetime as its timestamp) and the ext
types below, each made from its fields: a tuple (kept apart from a list:
handlers key dicts with them), a Decimal (an AMQP field table's), a
Permission (set_permissions and a sync), a DeadLetter (to shard 0's log),
whose fields are checked, and a bytearray (an AMQP byte array, which a
binding's identity tells from bytes: routing.table.freeze). msgpack packs a
bytearray as bytes by itself, so a value that must keep one goes through
`keeping_byte_arrays` first (the records that hold field tables:
amqp_server.shards.records.TABLES). `pack` refuses any other value
(TypeError: a set, a naive datetime, an int beyond 64 bits, any other
class) and `unpack` any other ext code or malformed field (ValueError), so
no bytes can name a class or call a function.
"""
from __future__ import annotations

import dataclasses
import decimal

import msgpack

from storage.dead_letter_log import DeadLetter
from vhosts.users import Permission

TUPLE, DECIMAL, PERMISSION, DEAD_LETTER, BYTEARRAY = 1, 2, 3, 4, 5

_NONE = type(None)
_OPTIONAL_STR = (str, _NONE)
_PERMISSION_TYPES = (str, str, str)
# The types of DeadLetter's fields (a field added there without one here fails at import).
_DEAD_LETTER = {
    "time": (int, float), "vhost": str, "queue": str, "reason": str, "exchange": str, "routing_keys": list,
    "dead_letter_exchange": _OPTIONAL_STR, "dead_letter_routing_key": _OPTIONAL_STR, "death_count": int,
    "delivery_count": int, "content_type": _OPTIONAL_STR, "message_id": _OPTIONAL_STR,
    "correlation_id": _OPTIONAL_STR, "app_id": _OPTIONAL_STR, "timestamp": (int, _NONE), "headers": (dict, _NONE),
    "body_size": int, "body": (bytes, _NONE), "offset": int,
}
_DEAD_LETTER_FIELDS = tuple(field.name for field in dataclasses.fields(DeadLetter))
_DEAD_LETTER_TYPES = tuple(_DEAD_LETTER[name] for name in _DEAD_LETTER_FIELDS)


class _Packers:
    """msgpack Packers, one per depth: an ext value's fields are packed while
    the value holding it is, and a Packer is not re-entrant."""

    def __init__(self) -> None:
        self._packers: list[msgpack.Packer] = []
        self._depth = 0

    def pack(self, value) -> bytes:
        depth = self._depth
        if depth == len(self._packers):
            # strict_types: a tuple (or any subclass of a msgpack type) is not packed as
            # its base but handed to `_ext`, which keeps it a tuple or refuses it.
            self._packers.append(msgpack.Packer(default=_ext, strict_types=True, datetime=True))
        self._depth = depth + 1
        try:
            return self._packers[depth].pack(value)
        finally:
            self._depth = depth


_packers = _Packers()
pack = _packers.pack


def _ext(value) -> msgpack.ExtType:
    kind = type(value)
    if kind is tuple:
        return msgpack.ExtType(TUPLE, pack(list(value)))
    if kind is decimal.Decimal:
        return msgpack.ExtType(DECIMAL, str(value).encode("ascii"))
    if kind is Permission:
        return msgpack.ExtType(PERMISSION, pack([value.configure, value.write, value.read]))
    if kind is DeadLetter:
        return msgpack.ExtType(DEAD_LETTER, pack([getattr(value, name) for name in _DEAD_LETTER_FIELDS]))
    raise TypeError("a shard carries no %s to another" % kind.__name__)


def keeping_byte_arrays(value):
    """`value` with each bytearray in it (in its lists, tuples and dicts) an ext value of its own."""
    kind = type(value)
    if kind is bytearray:
        return msgpack.ExtType(BYTEARRAY, bytes(value))
    if kind is dict:
        return {key: keeping_byte_arrays(item) for key, item in value.items()}
    if kind is list:
        return [keeping_byte_arrays(item) for item in value]
    if kind is tuple:
        return tuple(keeping_byte_arrays(item) for item in value)
    return value


def unpack(data):
    """The value `data` (bytes, or a view of them) holds; ValueError when it holds none."""
    try:
        return msgpack.unpackb(data, ext_hook=_value, strict_map_key=False, timestamp=3)
    except (TypeError, ArithmeticError, RecursionError) as exc:  # an unhashable key, a bad Decimal, nested too deep
        raise ValueError("not a value a shard carries: %s" % exc) from exc


def _value(code: int, data: bytes):
    if code == TUPLE:
        items = unpack(data)
        if type(items) is list:
            return tuple(items)
    elif code == DECIMAL:
        return decimal.Decimal(data.decode("ascii"))
    elif code == BYTEARRAY:
        return bytearray(data)
    elif code == PERMISSION:
        fields = unpack(data)
        if _typed(fields, _PERMISSION_TYPES):
            return Permission(*fields)
    elif code == DEAD_LETTER:
        fields = unpack(data)
        if _typed(fields, _DEAD_LETTER_TYPES):
            return DeadLetter(*fields)
    raise ValueError("ext type %d: not a value a shard carries, or not of its fields" % code)


def _typed(fields, types: tuple) -> bool:
    return type(fields) is list and len(fields) == len(types) and all(map(isinstance, fields, types))

