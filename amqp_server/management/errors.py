"""The management API's errors, in RabbitMQ's JSON shape {"error", "reason"}."""
from __future__ import annotations

import contextlib

from vhosts.errors import ACCESS_REFUSED, NOT_FOUND, AMQPError

NOT_FOUND_BODY = {"error": "Object Not Found", "reason": "Not Found"}


class ApiError(Exception):
    def __init__(self, status: int, error: str, reason) -> None:
        """`reason` is text, or a list where RabbitMQ answers with an Erlang tuple."""
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason

    def body(self) -> dict:
        return {"error": self.error, "reason": self.reason}


def not_found() -> ApiError:
    """RabbitMQ's answer for an object (or route) that does not exist."""
    return ApiError(404, NOT_FOUND_BODY["error"], NOT_FOUND_BODY["reason"])


def bad_request(reason) -> ApiError:
    return ApiError(400, "bad_request", reason)


def not_authorised(reason: str) -> ApiError:
    return ApiError(401, "not_authorised", reason)


def from_amqp(error: AMQPError) -> ApiError:
    """What RabbitMQ's API answers when the operation fails as an AMQP method
    would: access refused is 401; not found 404 and any other refusal 400,
    with the explanation (the reply text without its code name)."""
    if error.reply_code == ACCESS_REFUSED:
        return not_authorised("Access refused.")
    explanation = error.reply_text.split(" - ", 1)[-1]
    if error.reply_code == NOT_FOUND:
        return ApiError(404, "not_found", explanation)
    return bad_request(explanation)


@contextlib.contextmanager
def amqp_errors_as_http():
    """Run a domain call, answering an `AMQPError` as RabbitMQ's API does."""
    try:
        yield
    except AMQPError as exc:
        raise from_amqp(exc) from None


def missing_keys(body: dict, keys: tuple[str, ...]) -> None:
    """RabbitMQ's 400 for required body keys, listed as Erlang terms."""
    missing = [key for key in keys if key not in body]
    if missing:
        raise bad_request("[%s]" % ",".join("{key_missing,%s}" % key for key in missing))
