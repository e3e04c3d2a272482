"""AMQP errors raised by the domain, carrying RabbitMQ's reply codes and texts.

Whether an error closes the channel or the whole connection follows from its
reply code (AMQP 0-9-1 spec, section 1.2 "constants": soft vs hard errors);
`amqp_server` is the one place that turns them into Close frames.
"""
from __future__ import annotations

REPLY_NAMES = {
    311: "CONTENT_TOO_LARGE",
    312: "NO_ROUTE",
    313: "NO_CONSUMERS",
    320: "CONNECTION_FORCED",
    402: "INVALID_PATH",
    403: "ACCESS_REFUSED",
    404: "NOT_FOUND",
    405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED",
    501: "FRAME_ERROR",
    502: "SYNTAX_ERROR",
    503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR",
    505: "UNEXPECTED_FRAME",
    506: "RESOURCE_ERROR",
    530: "NOT_ALLOWED",
    540: "NOT_IMPLEMENTED",
    541: "INTERNAL_ERROR",
}

# Soft errors close only the channel; every other code is a hard error.
CHANNEL_LEVEL = frozenset({311, 312, 313, 403, 404, 405, 406})

NOT_FOUND = 404
ACCESS_REFUSED = 403
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541
CONNECTION_FORCED = 320


class AMQPError(Exception):
    """`reply_text` is what goes on the wire: "NAME - explanation"."""

    def __init__(self, reply_code: int, explanation: str) -> None:
        self.reply_code = reply_code
        self.reply_text = f"{REPLY_NAMES[reply_code]} - {explanation}"
        # The method that failed (Close carries them); set by whoever knows it.
        self.class_id = 0
        self.method_id = 0
        self._attributed = False
        super().__init__(self.reply_text)

    @classmethod
    def from_reply(cls, reply_code: int, reply_text: str) -> "AMQPError":
        """The error another process answered, its reply text as it was (already "NAME - ...")."""
        error = cls(reply_code, "")
        error.reply_text = reply_text
        error.args = (reply_text,)
        return error

    def at(self, class_id: int, method_id: int) -> "AMQPError":
        """Attribute the error to a method unless it already is; returns self."""
        if not self._attributed:
            self._attributed = True
            self.class_id = class_id
            self.method_id = method_id
        return self

    @property
    def closes_connection(self) -> bool:
        return self.reply_code not in CHANNEL_LEVEL


def fmt_value(value: object) -> str:
    """Render a boolean/argument the way RabbitMQ's equivalence errors do."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def field_type(value: object) -> str:
    """The AMQP field type RabbitMQ names in error texts for a decoded value.

    The decoder drops the wire type, so integers are named as pika and most
    clients send them: 'I' (signedint) when they fit in 32 bits, else 'l'.
    """
    if value is None:
        return "void"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -0x80000000 <= value <= 0x7FFFFFFF else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    return "longstr"


def erl_binary(value: str) -> str:
    """How Erlang's ~p prints a binary: <<"text">> when printable, else its bytes."""
    raw = value.encode("utf-8")
    if raw and all(32 <= b < 127 for b in raw):
        return '<<"%s">>' % value.replace("\\", "\\\\").replace('"', '\\"')
    return "<<%s>>" % ",".join(str(b) for b in raw)


def erl_term(value: object) -> str:
    """A JSON-decoded value as Erlang's ~p prints the term RabbitMQ decodes
    it to (strings are binaries, true/false/null atoms, objects maps)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return erl_binary(value)
    if isinstance(value, list):
        return "[%s]" % ",".join(erl_term(v) for v in value)
    if isinstance(value, dict):
        return "#{%s}" % ",".join("%s => %s" % (erl_term(k), erl_term(v)) for k, v in value.items())
    return repr(value)
