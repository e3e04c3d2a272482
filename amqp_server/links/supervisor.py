"""The links of one broker: what runs the shovels (and federation links)
that its runtime parameters describe.

`Links` follows the broker's parameters (`vhosts.Broker.on_parameter_changed`):
a "shovel" parameter set starts (or restarts, when its value changed) that
shovel; cleared, it stops. At start it starts every shovel already stored,
so shovels come back with the broker. Each shovel runs on its own task and
survives anything its peers do (amqp_server.links.shovel).
"""
from __future__ import annotations

import asyncio
import logging

from vhosts.parameters import SHOVEL

from amqp_server.links.client import LocalNode
from amqp_server.links.shovel import Shovel

log = logging.getLogger("hutch.links")


class Links:
    def __init__(self, broker, local: LocalNode) -> None:
        self.broker = broker
        self.local = local
        self.shovels: dict[tuple[str, str], Shovel] = {}
        self._stopping: set[asyncio.Task] = set()
        self._running = False

    async def start(self) -> None:
        self._running = True
        self.broker.on_parameter_changed.append(self._parameter_changed)
        for vhost, component, name, value in self.broker.list_parameters(component=SHOVEL):
            self._parameter_changed(vhost, component, name, value)

    async def stop(self) -> None:
        self._running = False
        if self._parameter_changed in self.broker.on_parameter_changed:
            self.broker.on_parameter_changed.remove(self._parameter_changed)
        shovels, self.shovels = list(self.shovels.values()), {}
        await asyncio.gather(*(shovel.stop() for shovel in shovels), *self._stopping)

    # -- following the parameters ------------------------------------------------------

    def _parameter_changed(self, vhost: str, component: str, name: str, value) -> None:
        if component != SHOVEL or not self._running:
            return
        key = (vhost, name)
        old = self.shovels.get(key)
        if old is not None and value is not None and old.value == value:
            return
        if old is not None:
            self._retire(self.shovels.pop(key))
        if value is not None:
            shovel = self.shovels[key] = Shovel(vhost, name, value, self.local, lambda: self._finished(vhost, name))
            shovel.start()

    def _retire(self, shovel: Shovel) -> None:
        """Stop a shovel in the background (this may be called from its own task)."""
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
        shovel = self.shovels[(vhost, name)] = Shovel(vhost, name, old.value, self.local,
                                                      lambda: self._finished(vhost, name))
        shovel.start()
        return True
