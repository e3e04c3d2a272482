"""Permissions enforced on every AMQP operation, as RabbitMQ 3.10 maps them
(texts probed on a real RabbitMQ): each rule allowed and denied, with pika
clients of users the test creates on the `live` broker.
"""
from __future__ import annotations

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ProbableAccessDeniedError

from helpers import channel_error, publish_sync, unique
from vhosts.users import Permission

NOTHING = "^$"


def refused(kind: str, name: str, user: str, vhost: str = "/") -> str:
    return "ACCESS_REFUSED - access to %s '%s' in vhost '%s' refused for user '%s'" % (kind, name, vhost, user)


def topic_refused(key: str, exchange: str, user: str, vhost: str = "/") -> str:
    return "ACCESS_REFUSED - access to topic '%s' in exchange '%s' in vhost '%s' refused for user '%s'" % (
        key, exchange, vhost, user)


class Users:
    """Users made for one test, and admin-made resources they act on."""

    def __init__(self, live) -> None:
        self.live = live
        self.opened = []

    def make(self, configure=".*", write=".*", read=".*", vhost="/") -> str:
        name = unique("user")
        self.live.admin(lambda b: b.add_user(name, "pw"))
        self.live.admin(lambda b: b.set_permissions(name, vhost, Permission(configure, write, read)))
        return name

    def connect(self, user: str, vhost: str = "/") -> pika.BlockingConnection:
        params = pika.ConnectionParameters("127.0.0.1", self.live.port, vhost, pika.PlainCredentials(user, "pw"))
        connection = pika.BlockingConnection(params)
        self.opened.append(connection)
        return connection

    def channel(self, user: str):
        return self.connect(user).channel()

    def admin_channel(self):
        return self.connect(self.make()).channel()


@pytest.fixture
def users(live):
    made = Users(live)
    yield made
    for connection in made.opened:
        if connection.is_open:
            connection.close()


@pytest.fixture
def setup(users):
    """A channel of a user with every permission, to create what others use."""
    return users.admin_channel()


# -- exchanges --------------------------------------------------------------------------


def test_exchange_declare_needs_configure(users):
    user = users.make(configure="^mine-")
    ch = users.channel(user)
    mine = unique("mine-x")
    ch.exchange_declare(mine, "direct")
    other = unique("other-x")
    assert channel_error(users.channel(user).exchange_declare, other, "direct") == (403, refused("exchange", other, user))


def test_configure_is_checked_before_the_reserved_prefix(users):
    user = users.make(configure=NOTHING)
    code, text = channel_error(users.channel(user).exchange_declare, "amq.foo", "direct")
    assert (code, text) == (403, refused("exchange", "amq.foo", user))


def test_passive_declares_need_no_permission(users, setup):
    queue = unique("q")
    setup.queue_declare(queue)
    user = users.make(NOTHING, NOTHING, NOTHING)
    ch = users.channel(user)
    ch.exchange_declare("amq.direct", "direct", passive=True)
    ch.queue_declare(queue, passive=True)


def test_exchange_declare_with_alternate_exchange_needs_read_on_it_and_write_on_the_ae(users):
    x, ae = unique("x"), unique("ae")
    user = users.make(write=NOTHING)
    code, text = channel_error(users.channel(user).exchange_declare, x, "direct", arguments={"alternate-exchange": ae})
    assert (code, text) == (403, refused("exchange", ae, user))
    user = users.make(read=NOTHING)
    code, text = channel_error(users.channel(user).exchange_declare, x, "direct", arguments={"alternate-exchange": ae})
    assert (code, text) == (403, refused("exchange", x, user))
    users.channel(users.make(write="^ae-")).exchange_declare(x, "direct", arguments={"alternate-exchange": ae})


def test_exchange_delete_needs_configure(users, setup):
    x = unique("x")
    setup.exchange_declare(x, "direct")
    user = users.make(configure=NOTHING)
    assert channel_error(users.channel(user).exchange_delete, x) == (403, refused("exchange", x, user))
    users.channel(users.make(configure="^x-")).exchange_delete(x)


# -- queues ------------------------------------------------------------------------------


def test_queue_declare_needs_configure(users):
    user = users.make(configure="^mine-")
    users.channel(user).queue_declare(unique("mine-q"), exclusive=True)
    other = unique("q")
    assert channel_error(users.channel(user).queue_declare, other) == (403, refused("queue", other, user))


def test_server_named_queues_are_checked_under_their_generated_name(users):
    user = users.make(configure="^mine-")
    with pytest.raises(ChannelClosedByBroker) as info:
        users.channel(user).queue_declare("", exclusive=True)
    assert info.value.reply_code == 403
    assert info.value.reply_text.startswith("ACCESS_REFUSED - access to queue 'amq.gen-")
    assert info.value.reply_text.endswith("' in vhost '/' refused for user '%s'" % user)
    allowed = users.make(configure=r"^amq\.gen-")
    assert users.channel(allowed).queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")


def test_queue_declare_with_a_dead_letter_exchange_needs_read_on_it_and_write_on_the_dlx(users):
    q = unique("q")
    user = users.make(write=NOTHING)
    code, text = channel_error(users.channel(user).queue_declare, q, arguments={"x-dead-letter-exchange": "dlx"})
    assert (code, text) == (403, refused("exchange", "dlx", user))
    user = users.make(read=NOTHING)
    code, text = channel_error(users.channel(user).queue_declare, q, arguments={"x-dead-letter-exchange": "dlx"})
    assert (code, text) == (403, refused("queue", q, user))
    users.channel(users.make(write="^dlx$")).queue_declare(q, exclusive=True, arguments={"x-dead-letter-exchange": "dlx"})


def test_queue_delete_needs_configure(users, setup):
    q = unique("q")
    setup.queue_declare(q)
    user = users.make(configure=NOTHING)
    assert channel_error(users.channel(user).queue_delete, q) == (403, refused("queue", q, user))
    users.channel(users.make(configure="^q-")).queue_delete(q)


@pytest.mark.parametrize("operation", ["purge", "get", "consume"])
def test_purge_get_and_consume_need_read(users, setup, operation):
    q = unique("q")
    setup.queue_declare(q)
    setup.basic_publish("", q, b"m")

    def run(channel):
        if operation == "purge":
            return channel.queue_purge(q).method.message_count
        if operation == "get":
            return channel.basic_get(q, auto_ack=True)[2]
        return channel.basic_consume(q, lambda *a: None)

    user = users.make(read=NOTHING)
    assert channel_error(run, users.channel(user)) == (403, refused("queue", q, user))
    assert run(users.channel(users.make(configure=NOTHING, write=NOTHING, read="^q-")))


# -- bindings ----------------------------------------------------------------------------


@pytest.mark.parametrize("unbind", [False, True])
def test_queue_bind_needs_write_on_the_queue_and_read_on_the_exchange(users, setup, unbind):
    q = unique("q")
    setup.queue_declare(q)
    setup.queue_bind(q, "amq.direct", "k")

    def run(channel):
        (channel.queue_unbind if unbind else channel.queue_bind)(q, "amq.direct", "k")

    user = users.make(write=NOTHING)
    assert channel_error(run, users.channel(user)) == (403, refused("queue", q, user))
    user = users.make(read=NOTHING)
    assert channel_error(run, users.channel(user)) == (403, refused("exchange", "amq.direct", user))
    run(users.channel(users.make(configure=NOTHING, write="^q-", read="^amq\\.direct$")))


def test_binding_permissions_come_before_the_default_exchange_and_existence_checks(users, setup):
    user = users.make(read=NOTHING)
    q = unique("q")
    setup.queue_declare(q)
    assert channel_error(users.channel(user).queue_bind, q, "") == (
        403, "ACCESS_REFUSED - operation not permitted on the default exchange")
    assert channel_error(users.channel(user).queue_bind, q, "nope") == (403, refused("exchange", "nope", user))


@pytest.mark.parametrize("unbind", [False, True])
def test_exchange_bind_needs_write_on_the_destination_and_read_on_the_source(users, setup, unbind):
    dest = unique("dest")
    setup.exchange_declare(dest, "fanout")

    def run(channel):
        (channel.exchange_unbind if unbind else channel.exchange_bind)(dest, "amq.fanout")

    user = users.make(write=NOTHING)
    assert channel_error(run, users.channel(user)) == (403, refused("exchange", dest, user))
    user = users.make(read="^dest-")
    assert channel_error(run, users.channel(user)) == (403, refused("exchange", "amq.fanout", user))
    run(users.channel(users.make(configure=NOTHING, write="^dest-", read="^amq\\.fanout$")))


# -- publish -----------------------------------------------------------------------------


def test_publish_needs_write_on_the_exchange(users, setup):
    q = unique("q")
    setup.queue_declare(q)
    setup.queue_bind(q, "amq.direct", q)
    user = users.make(write=NOTHING)
    assert channel_error(publish_sync, users.channel(user), "amq.direct", q) == (
        403, refused("exchange", "amq.direct", user))
    publish_sync(users.channel(users.make(configure=NOTHING, write="direct", read=NOTHING)), "amq.direct", q)
    assert setup.queue_declare(q, passive=True).method.message_count == 1


def test_the_default_exchange_is_named_amq_default(users, setup):
    q = unique("q")
    setup.queue_declare(q)
    user = users.make(write="^w-")
    assert channel_error(publish_sync, users.channel(user), "", q) == (403, refused("exchange", "amq.default", user))
    publish_sync(users.channel(users.make(write=r"^amq\.default$")), "", q)
    assert setup.queue_declare(q, passive=True).method.message_count == 1


def test_write_permission_comes_before_the_exchange_lookup(users):
    user = users.make(write="^w")
    assert channel_error(publish_sync, users.channel(user), "nope", "k") == (403, refused("exchange", "nope", user))
    assert channel_error(publish_sync, users.channel(user), "w-nope", "k") == (
        404, "NOT_FOUND - no exchange 'w-nope' in vhost '/'")


def test_an_empty_pattern_allows_nothing(users):
    user = users.make("", "", "")
    assert channel_error(publish_sync, users.channel(user), "amq.direct", "k") == (
        403, refused("exchange", "amq.direct", user))


# -- topic permissions ---------------------------------------------------------------------


def test_topic_permissions_check_routing_keys_with_variables(live, users, setup):
    user = users.make()
    live.admin(lambda b: b.set_topic_permissions(user, "/", "amq.topic", r"^a\.{username}\.", r"^r\.{vhost}\."))
    q = unique("q")
    setup.queue_declare(q)
    ch = users.channel(user)
    publish_sync(ch, "amq.topic", "a.%s.x" % user)
    assert channel_error(publish_sync, ch, "amq.topic", "b.x") == (403, topic_refused("b.x", "amq.topic", user))
    users.channel(user).queue_bind(q, "amq.topic", "r./.x")
    assert channel_error(users.channel(user).queue_bind, q, "amq.topic", "zz") == (
        403, topic_refused("zz", "amq.topic", user))
    assert channel_error(users.channel(user).queue_unbind, q, "amq.topic", "zz") == (
        403, topic_refused("zz", "amq.topic", user))
    # Other exchanges, and other users, are not restricted.
    publish_sync(users.channel(user), "amq.direct", "b.x")
    publish_sync(users.channel(users.make()), "amq.topic", "b.x")
    live.admin(lambda b: b.clear_topic_permissions(user, "/", "amq.topic"))
    publish_sync(users.channel(user), "amq.topic", "b.x")


# -- when permissions change -----------------------------------------------------------------


def test_a_channel_keeps_the_grants_it_used_and_new_channels_see_changes(live, users, setup):
    user = users.make()
    connection = users.connect(user)
    ch = connection.channel()
    publish_sync(ch, "amq.direct", "k")
    live.admin(lambda b: b.set_permissions(user, "/", Permission(".*", NOTHING, ".*")))
    publish_sync(ch, "amq.direct", "k")  # RabbitMQ's per-channel cache of granted checks
    assert channel_error(publish_sync, ch, "amq.fanout", "k") == (403, refused("exchange", "amq.fanout", user))
    assert channel_error(publish_sync, connection.channel(), "amq.direct", "k") == (
        403, refused("exchange", "amq.direct", user))


def test_without_permissions_on_a_vhost_a_user_cannot_open_it(live, users):
    user = users.make()
    live.admin(lambda b: b.clear_permissions(user, "/"))
    with pytest.raises(ProbableAccessDeniedError) as info:
        users.connect(user)
    assert "NOT_ALLOWED - access to vhost '/' refused for user '%s'" % user in str(info.value)


def test_topic_grants_are_cached_per_channel_too(live, users):
    user = users.make()
    live.admin(lambda b: b.set_topic_permissions(user, "/", "amq.topic", "^a", ".*"))
    connection = users.connect(user)
    ch = connection.channel()
    publish_sync(ch, "amq.topic", "a.1")
    live.admin(lambda b: b.set_topic_permissions(user, "/", "amq.topic", "^b", ".*"))
    publish_sync(ch, "amq.topic", "a.1")
    assert channel_error(publish_sync, ch, "amq.topic", "a.2") == (403, topic_refused("a.2", "amq.topic", user))
    assert channel_error(publish_sync, connection.channel(), "amq.topic", "a.1") == (
        403, topic_refused("a.1", "amq.topic", user))
