"""ResourceAlarms on its own: limits from the configuration, which alarms are
raised, the reason texts, and that exactly the blocked connections are
released when the last alarm clears."""
from __future__ import annotations

from amqp_server.shared.alarms import DISK, MEMORY, ResourceAlarms, disk_free_limit, memory_limit
from amqp_server.shared.config import BrokerConfig
from storage.memory_monitor import total_memory


class Publisher:
    def __init__(self) -> None:
        self.events: list[str] = []

    def alarm_blocked(self, alarms) -> None:
        self.events.append("blocked: " + alarms.reason)

    def alarm_cleared(self, alarms) -> None:
        self.events.append("cleared")


def config(tmp_path, **storage) -> BrokerConfig:
    cfg = BrokerConfig(data_dir=str(tmp_path))
    for key, value in storage.items():
        setattr(cfg.storage, key, value)
    return cfg


def test_limits_follow_the_configuration(tmp_path):
    cfg = config(tmp_path)
    assert memory_limit(cfg) == int(0.4 * total_memory())
    assert disk_free_limit(cfg) == 50_000_000
    cfg.storage.vm_memory_high_watermark_absolute = 12345
    cfg.storage.disk_free_limit_mem_relative = 0.5
    assert memory_limit(cfg) == 12345
    assert disk_free_limit(cfg) == int(0.5 * total_memory())


def test_alarms_raise_block_and_release(tmp_path):
    alarms = ResourceAlarms(config(tmp_path, vm_memory_high_watermark_absolute=1))
    alarms.check()
    assert alarms.raised == {MEMORY} and alarms.reason == "low on memory"
    first, second = Publisher(), Publisher()
    alarms.block(first)
    alarms.block(first)  # a second publish while blocked changes nothing
    alarms.config.storage.disk_free_limit = alarms.disk_free + 1
    alarms.check()
    assert alarms.raised == {MEMORY, DISK} and alarms.reason == "low on memory and disk"
    alarms.block(second)
    alarms.config.storage.vm_memory_high_watermark_absolute = None
    alarms.check()
    assert alarms.raised == {DISK}
    assert first.events == ["blocked: low on memory"]  # still blocked by the disk alarm
    alarms.config.storage.disk_free_limit = 0
    alarms.check()
    assert not alarms.raised and not alarms.flow_waiters
    assert first.events == ["blocked: low on memory", "cleared"]
    assert second.events == ["blocked: low on memory and disk", "cleared"]
