"""The command table: every command hutchctl knows, by name."""
from __future__ import annotations

from cli.hutchctl import access, cluster, dead_letters, links, listings, node, policies, queues, streams

COMMANDS = {command.name: command
            for module in (listings, access, policies, queues, node, dead_letters, links, streams, cluster)
            for command in module.COMMANDS}
