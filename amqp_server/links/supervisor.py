"""The links of one broker: what runs the shovels and federation links
that its runtime parameters and policies describe.

`Links` follows the broker's parameters (`vhosts.Broker.on_parameter_changed`):
a "shovel" parameter set starts (or restarts, when its value changed) that
shovel; cleared, it stops. At start it starts every shovel already stored,
so shovels come back with the broker. Each link runs on its own task and
survives anything its peers do (amqp_server.links.link).

Federation links are reconciled: the links that should run (one per
exchange or queue whose policy names upstreams, and per upstream:
amqp_server.links.federation) are computed from the vhosts and compared
with those running; new ones start, gone ones stop, changed ones restart.
That happens when a policy or a federation parameter changes, and every
`RECONCILE_INTERVAL` for exchanges and queues declared or deleted since
(a vhost whose policies name no upstream costs one look at its policies).
"""
from __future__ import annotations

import asyncio
import logging

from vhosts.parameters import FEDERATION_UPSTREAM, FEDERATION_UPSTREAM_SET, SHOVEL

from amqp_server.links import access
from amqp_server.links.client import LocalNode
from amqp_server.links.federation import ExchangeLink, QueueLink, upstreams_for
from amqp_server.links.shovel import Shovel

log = logging.getLogger("hutch.links")

RECONCILE_INTERVAL = 1.0  # seconds
_FEDERATION_KEYS = ("federation-upstream", "federation-upstream-set")


class Links:
    def __init__(self, broker, local: LocalNode) -> None:
        self.broker = broker
        self.local = local
        self.shovels: dict[tuple[str, str], Shovel] = {}
        # (vhost, "exchange" or "queue", name, upstream name) -> running link
        self.federation: dict[tuple[str, str, str, str], ExchangeLink | QueueLink] = {}
        self._stopping: set[asyncio.Task] = set()
        self._running = False
        self._ticker: asyncio.Task | None = None

    async def start(self) -> None:
        self._running = True
        self.broker.on_parameter_changed.append(self._parameter_changed)
        self.broker.on_policies_changed.append(self._policies_changed)
        for vhost, component, name, value in self.broker.list_parameters(component=SHOVEL):
            self._parameter_changed(vhost, component, name, value)
        self.reconcile_federation()
        self._ticker = asyncio.get_running_loop().create_task(self._tick(), name="federation reconcile")

    async def stop(self) -> None:
        self._running = False
        if self._ticker is not None:
            self._ticker.cancel()
        for hooks, hook in ((self.broker.on_parameter_changed, self._parameter_changed),
                            (self.broker.on_policies_changed, self._policies_changed)):
            if hook in hooks:
                hooks.remove(hook)
        links = list(self.shovels.values()) + list(self.federation.values())
        self.shovels, self.federation = {}, {}
        await asyncio.gather(*(link.stop() for link in links), *self._stopping)

    # -- following the parameters ------------------------------------------------------

    def _parameter_changed(self, vhost: str, component: str, name: str, value) -> None:
        if not self._running:
            return
        if component in (FEDERATION_UPSTREAM, FEDERATION_UPSTREAM_SET):
            self.reconcile_federation()
        if component != SHOVEL:
            return
        key = (vhost, name)
        old = self.shovels.get(key)
        if old is not None and value is not None and old.value == value:
            return
        if old is not None:
            self._retire(self.shovels.pop(key))
        if value is not None:
            self._start_shovel(vhost, name, value)

    def _policies_changed(self, _vhost: str) -> None:
        if self._running:
            self.reconcile_federation()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(RECONCILE_INTERVAL)
            self.reconcile_federation()

    def _wanted_federation(self) -> dict:
        wanted = {}
        for vhost in self.broker.vhosts.values():
            if not any(key in p.definition for p in vhost.policies.values() for key in _FEDERATION_KEYS):
                continue
            candidates = [("exchange", name) for name, x in vhost.exchanges.items() if not x.builtin and name]
            candidates += [("queue", name) for name, q in vhost.queues.items() if q.exclusive_owner is None]
            for kind, name in candidates:
                policy = vhost.policy_for(kind, name)
                if policy is None:
                    continue
                for upstream in upstreams_for(vhost, policy.definition):
                    wanted[(vhost.name, kind, name, upstream.name)] = (vhost, upstream)
        return wanted

    def reconcile_federation(self) -> None:
        """Start, stop and restart federation links to match the vhosts."""
        wanted = self._wanted_federation()
        for key in [key for key, link in self.federation.items()
                    if key not in wanted or wanted[key][1] != link.upstream]:
            self._retire(self.federation.pop(key))
        for key, (vhost, upstream) in wanted.items():
            if key not in self.federation:
                kind = ExchangeLink if key[1] == "exchange" else QueueLink
                link = self.federation[key] = kind(vhost, key[2], upstream, self.local)
                uris = upstream.uris + (link.downstream_uri,)
                link.refusal = self._refusal(vhost.name, FEDERATION_UPSTREAM, upstream.name, uris)
                link.start()

    def may_connect(self, user_name: str):
        """The check of the URIs of a parameter `user_name` sets
        (amqp_server.links.access.may_connect)."""
        return access.may_connect(self.broker, self.local, user_name)

    def _refusal(self, vhost: str, component: str, name: str, uris):
        """The link's access check (amqp_server.links.access): the owner of
        the parameter is looked up at each check, so it follows changes."""
        def refusal() -> str | None:
            v = self.broker.vhosts.get(vhost)
            owner = v.parameter_owners.get((component, name)) if v is not None else None
            return access.refusal(self.broker, self.local, owner, uris)
        return refusal

    def federation_status(self, vhost: str | None = None) -> list[dict]:
        return [self.federation[key].status() for key in sorted(self.federation) if vhost in (None, key[0])]

    def _retire(self, shovel) -> None:
        """Stop a link in the background (this may be called from its own task)."""
        task = asyncio.get_running_loop().create_task(shovel.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def _finished(self, vhost: str, name: str) -> None:
        """src-delete-after reached: the shovel deletes its own parameter."""
        log.info("shovel '%s' in vhost '%s' moved what src-delete-after asked for: deleting it", name, vhost)
        try:
            self.broker.clear_parameter(vhost, SHOVEL, name)
        except LookupError:
            pass

    # -- administration -----------------------------------------------------------------

    def shovel_status(self, vhost: str | None = None) -> list[dict]:
        return [self.shovels[key].status() for key in sorted(self.shovels) if vhost in (None, key[0])]

    def restart_shovel(self, vhost: str, name: str) -> bool:
        """False when there is no such shovel."""
        old = self.shovels.get((vhost, name))
        if old is None:
            return False
        self._retire(old)
        self._start_shovel(vhost, name, old.value)
        return True

    def _start_shovel(self, vhost: str, name: str, value: dict) -> None:
        shovel = self.shovels[(vhost, name)] = Shovel(vhost, name, value, self.local,
                                                      lambda: self._finished(vhost, name))
        shovel.refusal = self._refusal(vhost, SHOVEL, name, shovel.spec.src_uris + shovel.spec.dest_uris)
        shovel.start()
