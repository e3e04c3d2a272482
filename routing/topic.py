"""Topic exchange: binding keys are patterns over dot-separated words.

Words: ``key.split(".")``, except that the empty key has no words ("a." is ["a", ""], "a..b"
has three words).  In a binding key the whole word ``*`` matches exactly one word and ``#``
matches zero or more; any other word (including "a*" or "") matches itself only.

Bindings live in a word trie, as in RabbitMQ.  Routing runs the trie as an NFA over the words
of the routing key, with a set of current nodes: a literal or ``*`` edge consumes one word, a
``#`` node may consume any number of words, and entering a node also enters its ``#`` child
(``#`` matching zero words).  Cost depends on the key and on the patterns that can still match,
not on the number of bindings.

Invariants:
- The trie holds exactly the paths of live binding keys: every node other than the root has a
  destination, a child or a ``#`` child; ``_detach`` prunes nodes as they empty.
- ``node.dests[d]`` counts the live bindings to ``d`` whose key ends at ``node`` (bindings
  differing only in arguments share a node); zero counts are deleted.
- A node is a ``#`` node exactly when it is the ``hash`` child of its parent.
Nothing is cached, so there is nothing to go stale on unbind.
"""

from collections.abc import Mapping, Sequence

from .destination import Destination
from .table import BindingId, BindingTable


def _words(key: str) -> list[str]:
    return key.split(".") if key else []


def topic_matches(binding_key: str, routing_key: str) -> bool:
    """Reference predicate: does ``binding_key`` match ``routing_key``?

    Walks the pattern keeping the set of routing-key positions the pattern prefix can end at;
    independent of the trie so tests can use it as an oracle.
    """
    words = _words(routing_key)
    size = len(words)
    ends = {0}
    for part in _words(binding_key):
        if part == "#":
            ends = set(range(min(ends), size + 1))
        elif part == "*":
            ends = {i + 1 for i in ends if i < size}
        else:
            ends = {i + 1 for i in ends if i < size and words[i] == part}
        if not ends:
            return False
    return size in ends


class _Node:
    __slots__ = ("children", "hash", "dests", "is_hash")

    def __init__(self, is_hash: bool) -> None:
        self.children: dict[str, _Node] | None = None  # literal words and "*"
        self.hash: _Node | None = None  # the "#" child
        self.dests: dict[Destination, int] | None = None
        self.is_hash = is_hash

    def is_empty(self) -> bool:
        return not self.dests and not self.children and self.hash is None


def _enter(states: set, node: _Node | None) -> None:
    """Add ``node`` and the chain of ``#`` children reachable from it without a word."""
    while node is not None and node not in states:
        states.add(node)
        node = node.hash


class TopicTable(BindingTable):
    __slots__ = ("_root",)

    def __init__(self) -> None:
        super().__init__()
        self._root = _Node(False)

    def _attach(self, bid: BindingId, arguments: dict) -> None:
        dest, key, _ = bid
        node = self._root
        for word in _words(key):
            if word == "#":
                if node.hash is None:
                    node.hash = _Node(True)
                node = node.hash
            else:
                if node.children is None:
                    node.children = {}
                child = node.children.get(word)
                if child is None:
                    child = node.children[word] = _Node(False)
                node = child
        if node.dests is None:
            node.dests = {}
        node.dests[dest] = node.dests.get(dest, 0) + 1

    def _detach(self, bid: BindingId) -> None:
        dest, key, _ = bid
        path: list[tuple[_Node, str]] = []  # (parent, word leading to the next node)
        node = self._root
        for word in _words(key):
            path.append((node, word))
            node = node.hash if word == "#" else node.children[word]
        count = node.dests[dest]
        if count > 1:
            node.dests[dest] = count - 1
            return
        del node.dests[dest]
        while path and node.is_empty():
            parent, word = path.pop()
            if word == "#":
                parent.hash = None
            else:
                del parent.children[word]
            node = parent

    def _states(self, words: list[str]) -> set[_Node]:
        states: set[_Node] = set()
        _enter(states, self._root)
        for word in words:
            after: set[_Node] = set()
            for node in states:
                if node.is_hash:
                    _enter(after, node)
                children = node.children
                if children:
                    _enter(after, children.get(word))
                    _enter(after, children.get("*"))
            if not after:
                return after
            states = after
        return states

    def route(self, routing_keys: Sequence[str], headers: Mapping | None) -> set[Destination]:
        found: set[Destination] = set()
        for key in routing_keys:
            for node in self._states(_words(key)):
                if node.dests:
                    found.update(node.dests)
        return found
