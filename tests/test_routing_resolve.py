"""resolve(): exchange-to-exchange bindings, alternate exchanges, cycles, CC-style keys."""

from dataclasses import dataclass, field

from routing import Destination, resolve, table_for


@dataclass
class Exchange:
    type: str
    alternate_exchange: str | None = None
    table: object = field(init=False)

    def __post_init__(self):
        self.table = table_for(self.type)


class Broker:
    def __init__(self):
        self.exchanges: dict[str, Exchange] = {}

    def declare(self, name, type_="direct", alternate=None):
        self.exchanges[name] = Exchange(type_, alternate)

    def bind_queue(self, exchange, queue, key="", args=None):
        self.exchanges[exchange].table.bind(Destination("queue", queue), key, args)

    def bind_exchange(self, source, destination, key="", args=None):
        self.exchanges[source].table.bind(Destination("exchange", destination), key, args)

    def route(self, source, *keys, headers=None):
        return resolve(source, list(keys), headers, self.exchanges.get)


def test_single_exchange():
    b = Broker()
    b.declare("x")
    b.bind_queue("x", "q1", "a")
    b.bind_queue("x", "q2", "b")
    assert b.route("x", "a") == {"q1"}
    assert b.route("x", "c") == set()


def test_missing_source_routes_nowhere():
    assert Broker().route("nope", "a") == set()


def test_exchange_chain_and_fan_in():
    b = Broker()
    b.declare("x1", "topic")
    b.declare("x2", "direct")
    b.declare("x3", "fanout")
    b.bind_exchange("x1", "x2", "a.#")
    b.bind_exchange("x1", "x3", "#")
    b.bind_exchange("x2", "x3", "a.b")
    b.bind_queue("x2", "q2", "a.b")
    b.bind_queue("x3", "q3")
    b.bind_queue("x1", "q1", "*.b")
    assert b.route("x1", "a.b") == {"q1", "q2", "q3"}
    assert b.route("x1", "z") == {"q3"}


def test_cycles_terminate_and_each_exchange_routes_once():
    b = Broker()
    for name in ("a", "b", "c"):
        b.declare(name, "fanout")
    b.bind_exchange("a", "b")
    b.bind_exchange("b", "c")
    b.bind_exchange("c", "a")
    b.bind_exchange("a", "a")
    b.bind_queue("c", "qc")
    calls = []
    lookup = b.exchanges.get
    assert resolve("a", ["k"], None, lambda n: calls.append(n) or lookup(n)) == {"qc"}
    assert sorted(calls) == ["a", "b", "c"]


def test_alternate_exchange_used_only_when_nothing_matches():
    b = Broker()
    b.declare("ae", "fanout")
    b.bind_queue("ae", "unrouted")
    b.declare("x", "direct", alternate="ae")
    b.bind_queue("x", "q", "a")
    assert b.route("x", "a") == {"q"}
    assert b.route("x", "b") == {"unrouted"}


def test_exchange_destination_counts_as_a_match_for_alternate():
    # RabbitMQ: A -k-> B with B empty: A's AE is not used, B's AE is.
    b = Broker()
    for name in ("ae_a", "ae_b"):
        b.declare(name, "fanout")
        b.bind_queue(name, "q_" + name)
    b.declare("a", "direct", alternate="ae_a")
    b.declare("b", "direct", alternate="ae_b")
    b.bind_exchange("a", "b", "k")
    assert b.route("a", "k") == {"q_ae_b"}
    assert b.route("a", "other") == {"q_ae_a"}


def test_self_binding_counts_as_a_match():
    b = Broker()
    b.declare("ae", "fanout")
    b.bind_queue("ae", "unrouted")
    b.declare("s", "direct", alternate="ae")
    b.bind_exchange("s", "s", "k")
    assert b.route("s", "k") == set()
    assert b.route("s", "z") == {"unrouted"}


def test_bound_exchange_that_is_missing_still_suppresses_alternate():
    b = Broker()
    b.declare("ae", "fanout")
    b.bind_queue("ae", "unrouted")
    b.declare("x", "direct", alternate="ae")
    b.bind_exchange("x", "gone", "k")
    assert b.route("x", "k") == set()


def test_alternate_exchange_chain():
    b = Broker()
    b.declare("h", "fanout")
    b.bind_queue("h", "qh")
    b.declare("g", "direct", alternate="h")
    b.declare("f", "direct", alternate="g")
    assert b.route("f", "z") == {"qh"}
    b.bind_queue("g", "qg", "z")
    assert b.route("f", "z") == {"qg"}


def test_alternate_of_an_exchange_reached_by_binding():
    b = Broker()
    b.declare("h", "fanout")
    b.bind_queue("h", "qh")
    b.declare("g", "direct", alternate="h")
    b.declare("f", "direct", alternate="g")
    b.bind_exchange("f", "g", "k")
    assert b.route("f", "k") == {"qh"}  # g seen through the binding; its AE applies


def test_missing_alternate_exchange():
    b = Broker()
    b.declare("x", "direct", alternate="nope")
    assert b.route("x", "z") == set()


def test_alternate_cycle_terminates():
    b = Broker()
    b.declare("d", "direct", alternate="e")
    b.declare("e", "direct", alternate="d")
    assert b.route("d", "z") == set()
    b.bind_queue("e", "qe", "z")
    assert b.route("d", "z") == {"qe"}


def test_alternate_already_seen_is_not_routed_again():
    b = Broker()
    b.declare("a", "fanout")
    b.declare("b", "direct", alternate="a")
    b.bind_exchange("a", "b")
    b.bind_queue("a", "qa", "ignored")
    assert b.route("a", "k") == {"qa"}


def test_cc_style_multiple_keys_union():
    b = Broker()
    b.declare("x", "direct", alternate="ae")
    b.declare("ae", "fanout")
    b.bind_queue("ae", "unrouted")
    b.declare("t", "topic")
    b.bind_queue("x", "q1", "k1")
    b.bind_queue("x", "q2", "k2")
    b.bind_exchange("x", "t", "k3")
    b.bind_queue("t", "qt", "k3")
    assert b.route("x", "k1", "k2") == {"q1", "q2"}
    assert b.route("x", "nothing", "k2") == {"q2"}  # one key matching is enough: no AE
    assert b.route("x", "k1", "k3") == {"q1", "qt"}
    assert b.route("x", "n1", "n2") == {"unrouted"}


def test_headers_exchange_in_chain():
    b = Broker()
    b.declare("x", "fanout")
    b.declare("h", "headers")
    b.bind_exchange("x", "h")
    b.bind_queue("h", "red", args={"colour": "red"})
    b.bind_queue("h", "any", args={"x-match": "any", "colour": "blue", "size": 1})
    assert b.route("x", "k", headers={"colour": "red"}) == {"red"}
    assert b.route("x", "k", headers={"size": 1}) == {"any"}
    assert b.route("x", "k") == set()
