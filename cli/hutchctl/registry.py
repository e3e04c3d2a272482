"""The command table: every command hutchctl knows, by name."""
from __future__ import annotations

from cli.hutchctl import listings

COMMANDS = {command.name: command for module in (listings,) for command in module.COMMANDS}
