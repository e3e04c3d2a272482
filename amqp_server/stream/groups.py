"""Single active consumer on streams (RabbitMQ 3.11+): subscriptions with the
property `single-active-consumer=true` and the same `name` on one stream
form a group, and one of them at a time gets messages.

- A stream's group: the first member (in subscribe order) is active; when
  it leaves, the next one becomes active.
- A super stream's partition (property `super-stream`): the active member
  is the one at the partition's index modulo the group's size, so the
  partitions spread over the members; when the group changes, the one that
  stops being active is told (consumer update, active false) and the new
  one is told it is active.
A member is told it became active with a consumer update (active true), and
starts reading where its answer says (`Subscription.activate`).
"""
from __future__ import annotations


class Group:
    __slots__ = ("members", "partition", "active")

    def __init__(self, partition: int | None) -> None:
        self.members: list = []
        self.partition = partition  # None: a plain stream's group
        self.active = None

    def _target(self):
        if not self.members:
            return None
        if self.partition is None:
            return self.members[0]
        return self.members[self.partition % len(self.members)]

    def rebalance(self) -> None:
        target = self._target()
        if target is self.active:
            return
        previous, self.active = self.active, target
        if previous is not None and previous in self.members:
            previous.deactivate()
        if target is not None:
            target.activate()


class Groups:
    """Every group of the node, by (vhost, stream, name)."""

    def __init__(self) -> None:
        self.groups: dict[tuple[str, str, str], Group] = {}

    def join(self, key: tuple[str, str, str], member, partition: int | None) -> None:
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = Group(partition)
        group.members.append(member)
        group.rebalance()

    def leave(self, key: tuple[str, str, str], member) -> None:
        group = self.groups.get(key)
        if group is None or member not in group.members:
            return
        group.members.remove(member)
        if group.active is member:
            group.active = None
        if group.members:
            group.rebalance()
        else:
            del self.groups[key]
