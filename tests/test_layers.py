"""Who may import whom (DESIGN.md section 2), checked by walking the AST of
every .py file in the project's packages.

- routing: the stdlib only;
- storage: stdlib, pamqp;
- vhosts: stdlib, routing, storage;
- amqp_server: stdlib (asyncio included), uvloop, pamqp, aiohttp (the management API), aetcd
  (the cluster's etcd client; and grpc, its transport, for etcd's TLS credentials), vhosts, routing, storage; aiormq in amqp_server.links only
  (shovels and federation are AMQP clients inside the broker: a well-kept asyncio client
  rather than a second one of our own);
- cli: anything (it is the composition root), but nothing imports cli;
- spark_sink: separate processes; no broker package imports it, and nothing
  in the broker imports pyspark.
Every package may import itself. Imports under `if TYPE_CHECKING:` count too,
and so do `importlib.import_module("...")` / `__import__("...")` with a
literal name.
"""
from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STDLIB = frozenset(sys.stdlib_module_names)
ANYTHING = None

# package -> third-party or project top-level modules it may import besides
# the stdlib and itself; ANYTHING = no allow-list, only the FORBIDDEN entries.
ALLOWED: dict[str, frozenset | None] = {
    "routing": frozenset(),
    "storage": frozenset({"pamqp"}),
    "vhosts": frozenset({"routing", "storage"}),
    "amqp_server": frozenset({"vhosts", "routing", "storage", "pamqp", "uvloop", "aiohttp", "aetcd",
                              "grpc"}),  # grpc: aetcd's transport, for etcd's TLS credentials
    "cli": ANYTHING,
    "spark_sink": ANYTHING,
}
# module prefix -> what it may import beyond its package's allow-list, and why
EXTRA: dict[str, frozenset] = {
    "amqp_server.links": frozenset({"aiormq"}),  # the AMQP client of shovels and federation links
}
FORBIDDEN: dict[str, frozenset] = {
    "cli": frozenset({"spark_sink", "pyspark"}),
    "spark_sink": frozenset({"cli"}),
}


def imported_modules(tree: ast.AST, module: str, is_package: bool):
    """(line, absolute module name or None when unresolvable, source text) for
    every import in `tree`, relative ones resolved against `module`."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, "import " + alias.name
        elif isinstance(node, ast.ImportFrom):
            text = "from %s%s import %s" % ("." * node.level, node.module or "",
                                            ", ".join(alias.name for alias in node.names))
            if node.level == 0:
                yield node.lineno, node.module, text
                continue
            parts = package.split(".") if package else []
            if node.level - 1 >= len(parts):
                yield node.lineno, None, text  # beyond the top-level package
                continue
            base = ".".join(parts[:len(parts) - (node.level - 1)])
            yield node.lineno, base + ("." + node.module if node.module else ""), text
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in ("import_module", "__import__"):
                yield node.lineno, node.args[0].value, "%s(%r)" % (name, node.args[0].value)


def check_source(source: str, module: str, filename: str, is_package: bool = False) -> list[str]:
    """Violations of the import arrows in one file, as readable lines."""
    top = module.split(".")[0]
    allowed, forbidden = ALLOWED[top], FORBIDDEN.get(top, frozenset())
    if allowed is not ANYTHING:
        allowed = allowed | frozenset().union(*(extra for prefix, extra in EXTRA.items()
                                                if module == prefix or module.startswith(prefix + ".")))
    tree = ast.parse(source, filename)
    problems = []
    for line, target, text in imported_modules(tree, module, is_package):
        if target is None:
            problems.append("%s:%d: %r: relative import beyond the top-level package" % (filename, line, text))
            continue
        target_top = target.split(".")[0]
        if target_top == top:
            continue
        if target_top in forbidden or (allowed is not ANYTHING and target_top not in allowed
                                       and target_top not in STDLIB):
            rule = "anything but %s" % ", ".join(sorted(forbidden)) if allowed is ANYTHING else \
                ", ".join(["the stdlib", top] + sorted(allowed))
            problems.append("%s:%d: %r: %s may not import %s (allowed: %s)"
                            % (filename, line, text, top, target_top, rule))
    return problems


def project_packages() -> list[str]:
    """The top-level packages pyproject.toml ships (each with its subpackages)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [pattern.rstrip("*") for pattern in config["tool"]["setuptools"]["packages"]["find"]["include"]]


def python_files(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        relative = path.relative_to(ROOT)
        parts = list(relative.with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        yield path, ".".join(parts), is_package


def test_every_package_has_a_rule():
    assert sorted(project_packages()) == sorted(ALLOWED), (
        "pyproject.toml's packages and this test's rules differ: add the new package's arrows here "
        "(and to DESIGN.md section 2)")


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_import_arrows(package):
    problems = []
    for path, module, is_package in python_files(package):
        problems += check_source(path.read_text(), module, str(path.relative_to(ROOT)), is_package)
    assert not problems, "imports against DESIGN.md section 2:\n" + "\n".join(problems)


def test_aiormq_only_in_links():
    """The links' extra arrow is theirs alone."""
    assert check_source("import aiormq\n", "amqp_server.links.shovel", "shovel.py") == []
    assert check_source("import aiormq\n", "amqp_server.channel", "channel.py") != []
    assert check_source("import aiormq\n", "amqp_server.linksx", "linksx.py") != []


def test_the_walk_sees_the_real_imports():
    # guards against a walk that silently finds nothing
    files = list(python_files("amqp_server"))
    assert any(module == "amqp_server.framing" for _, module, _ in files)
    found = {target for path, module, is_package in files
             for _, target, _ in imported_modules(ast.parse(path.read_text()), module, is_package)}
    assert {"pamqp", "vhosts.errors", "asyncio"} <= found
    routing_init = ROOT / "routing" / "__init__.py"
    assert "routing.topic" in {t for _, t, _ in imported_modules(ast.parse(routing_init.read_text()), "routing", True)}


# -- the checker itself, on synthetic sources ------------------------------------


@pytest.mark.parametrize("module, source, offender", [
    ("routing.topic", "import pamqp\n", "pamqp"),
    ("routing.topic", "from storage import Message\n", "storage"),
    ("routing.topic", "import yaml\n", "yaml"),
    ("storage.message", "from vhosts.errors import AMQPError\n", "vhosts"),
    ("storage.message", "import routing\n", "routing"),
    ("vhosts.queue", "from amqp_server import framing\n", "amqp_server"),
    ("vhosts.queue", "import pamqp.commands\n", "pamqp"),
    ("vhosts.queue", "from cli.settings import load_settings\n", "cli"),
    ("amqp_server.channel", "import cli\n", "cli"),
    ("amqp_server.channel", "from spark_sink import job\n", "spark_sink"),
    ("amqp_server.channel", "import pyspark.sql\n", "pyspark"),
    ("amqp_server.channel", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cli import x\n", "cli"),
    ("amqp_server.channel", "def f():\n    import aio_pika\n", "aio_pika"),
    ("amqp_server.channel", "import importlib\nm = importlib.import_module('cli.server')\n", "cli"),
    ("storage.message", "m = __import__('vhosts')\n", "vhosts"),
    ("cli.server", "import pyspark\n", "pyspark"),
    ("cli.server", "from spark_sink import job\n", "spark_sink"),
    ("spark_sink.job", "from cli import settings\n", "cli"),
])
def test_checker_reports_a_violation_naming_file_and_import(module, source, offender):
    problems = check_source(source, module, "pkg/file.py")
    assert len(problems) == 1, problems
    assert problems[0].startswith("pkg/file.py:")
    assert "may not import %s" % offender in problems[0]


@pytest.mark.parametrize("module, source", [
    ("routing.topic", "import re\nfrom collections.abc import Mapping\nfrom .table import BindingTable\n"),
    ("routing.topic", "from __future__ import annotations\nimport os.path\n"),
    ("storage.message", "from pamqp import commands\nfrom storage.backing_queue import QueueEntry\n"),
    ("vhosts.vhost", "import routing\nfrom storage import MemoryQueue\nfrom vhosts.errors import AMQPError\n"),
    ("amqp_server.server", "import asyncio\nimport uvloop\nimport ssl\nfrom vhosts import Broker\n"
                           "from routing import Destination\nfrom pamqp import frame\n"),
    ("cli.server", "import yaml\nfrom amqp_server.server import run\nimport vhosts\n"),
    ("spark_sink.job", "import pyspark\nimport pika\nfrom storage import Message\n"),
])
def test_checker_accepts_allowed_imports(module, source):
    assert check_source(source, module, "pkg/file.py") == []


def test_checker_resolves_relative_imports():
    # from ..storage inside routing/sub/mod.py is storage, not routing
    problems = check_source("from ..storage import x\n", "routing.sub.mod", "routing/sub/mod.py")
    assert problems == []  # ..storage from routing.sub is routing.storage: still routing
    problems = check_source("from ... import storage\n", "routing.sub.mod", "routing/sub/mod.py")
    assert len(problems) == 1 and "beyond the top-level package" in problems[0]
    assert check_source("from . import topic\n", "routing", "routing/__init__.py", is_package=True) == []
