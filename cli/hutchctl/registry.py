"""The command table: every command hutchctl knows, by name."""
from __future__ import annotations

from cli.hutchctl import access, cluster, dead_letters, listings, node, policies, queues

COMMANDS = {command.name: command
            for module in (listings, access, policies, queues, node, dead_letters, cluster) for command in module.COMMANDS}
