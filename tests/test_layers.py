"""Who may import whom (docs/architecture.md), checked by walking the AST of
every .py file in the project's packages.

Top-level packages:
- routing: the stdlib only;
- storage: stdlib, pamqp;
- vhosts: stdlib, routing, storage;
- amqp_server: stdlib (asyncio included), vhosts, routing, storage, and the
  third-party libraries its subpackages name below;
- cli: anything (it starts the process), but nothing imports cli;
- spark_sink: separate processes; no broker package imports it, and nothing
  in the broker imports pyspark.

Inside amqp_server, each subpackage is a layer with its own arrows
(SUBPACKAGES): `shared` imports no face; every face (amqp, mqtt, management,
links, cluster) may import `shared` and no other face (the links, AMQP
clients, read frames with the AMQP face's codec); `process`, the
composition root, imports them all and nothing imports it.
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
    "amqp_server": frozenset({"vhosts", "routing", "storage"}),  # + SUBPACKAGES' libraries
    "cli": ANYTHING,
    "spark_sink": ANYTHING,
}
# amqp_server's subpackages: which amqp_server modules (prefixes) and which
# third-party libraries each may import, besides itself, the stdlib, vhosts,
# routing and storage. ANYTHING: any amqp_server module.
SUBPACKAGES: dict[str, tuple[frozenset | None, frozenset]] = {
    "amqp_server": (frozenset(), frozenset()),  # the package's own __init__: a docstring
    "amqp_server.shared": (frozenset(), frozenset()),
    "amqp_server.amqp": (frozenset({"amqp_server.shared"}), frozenset({"pamqp"})),
    "amqp_server.mqtt": (frozenset({"amqp_server.shared"}), frozenset({"pamqp"})),
    # pyarrow: optional, imported by the stream API's format=arrow only (a 406 without it)
    "amqp_server.management": (frozenset({"amqp_server.shared"}), frozenset({"pamqp", "aiohttp", "pyarrow"})),
    # shovels and federation: AMQP clients inside the broker, on a well-kept asyncio client
    # (aiormq) reading frames with the AMQP face's sans-IO codec
    "amqp_server.links": (frozenset({"amqp_server.shared", "amqp_server.amqp.framing"}),
                          frozenset({"pamqp", "aiormq"})),
    # grpc: aetcd's transport, for etcd's TLS credentials (amqp_server.cluster.etcd)
    "amqp_server.cluster": (frozenset({"amqp_server.shared"}), frozenset({"aetcd", "grpc", "aiohttp"})),
    # the stream protocol (and the C twins of its bulk steps, through framing.C_TWINS); cramjam: its
    # compressed sub-entry batches (snappy, LZ4, zstd)
    "amqp_server.stream": (frozenset({"amqp_server.shared", "amqp_server.amqp.framing"}),
                           frozenset({"pamqp", "cramjam"})),
    # the links between the shards of one node (docs/scaling.md): the domain's side only; msgpack:
    # the records' data-only codec (amqp_server.shards.codec)
    "amqp_server.shards": (frozenset(), frozenset({"msgpack"})),
    "amqp_server.process": (ANYTHING, frozenset({"aiohttp", "uvloop"})),
}
# single modules outside amqp_server and the libraries they may import besides their package's, and why
MODULE_LIBRARIES: dict[str, frozenset] = {
    # AMQP 1.0 <-> 0-9-1 messages (one stream log, two protocols): Qpid Proton's codec, pamqp's properties
    "vhosts.amqp10": frozenset({"proton", "pamqp"}),
}
FORBIDDEN: dict[str, frozenset] = {
    "cli": frozenset({"spark_sink", "pyspark"}),
    "spark_sink": frozenset({"cli"}),
}


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


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
                target = node.module
            else:
                parts = package.split(".") if package else []
                if node.level - 1 >= len(parts):
                    yield node.lineno, None, text  # beyond the top-level package
                    continue
                base = ".".join(parts[:len(parts) - (node.level - 1)])
                target = base + ("." + node.module if node.module else "")
            # `from package import module` imports the module: name it, so that an arrow may
            # allow one module of another subpackage (the links read frames with amqp.framing)
            submodules = [target + "." + alias.name for alias in node.names if _is_module(target + "." + alias.name)]
            for found in submodules or [target]:
                yield node.lineno, found, text
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in ("import_module", "__import__"):
                yield node.lineno, node.args[0].value, "%s(%r)" % (name, node.args[0].value)


def subpackage(module: str) -> str:
    """The SUBPACKAGES key `module` belongs to (amqp_server modules only)."""
    parts = module.split(".")
    key = ".".join(parts[:2])
    return key if key in SUBPACKAGES and len(parts) > 1 and key != "amqp_server" else "amqp_server"


def _within(target: str, prefixes) -> bool:
    return any(target == prefix or target.startswith(prefix + ".") for prefix in prefixes)


def check_source(source: str, module: str, filename: str, is_package: bool = False) -> list[str]:
    """Violations of the import arrows in one file, as readable lines."""
    top = module.split(".")[0]
    allowed, forbidden = ALLOWED[top], FORBIDDEN.get(top, frozenset())
    inner, libraries = SUBPACKAGES[subpackage(module)] if top == "amqp_server" else (None, frozenset())
    if allowed is not ANYTHING:
        allowed = allowed | libraries | MODULE_LIBRARIES.get(module, frozenset())
    tree = ast.parse(source, filename)
    problems = []
    for line, target, text in imported_modules(tree, module, is_package):
        if target is None:
            problems.append("%s:%d: %r: relative import beyond the top-level package" % (filename, line, text))
            continue
        target_top = target.split(".")[0]
        if target_top == top:
            if top == "amqp_server" and target != "amqp_server":
                own = subpackage(module)
                if subpackage(target) != own and inner is not ANYTHING and not _within(target, inner):
                    problems.append("%s:%d: %r: %s may not import %s (allowed: itself, %s)" % (
                        filename, line, text, own, subpackage(target), ", ".join(sorted(inner)) or "no other"))
            continue
        if target_top in forbidden or (allowed is not ANYTHING and target_top not in allowed
                                       and target_top not in STDLIB):
            rule = "anything but %s" % ", ".join(sorted(forbidden)) if allowed is ANYTHING else \
                ", ".join(["the stdlib", top] + sorted(allowed))
            problems.append("%s:%d: %r: %s may not import %s (allowed: %s)"
                            % (filename, line, text, subpackage(module) if top == "amqp_server" else top,
                               target_top, rule))
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
        "(and to docs/architecture.md)")


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_import_arrows(package):
    problems = []
    for path, module, is_package in python_files(package):
        problems += check_source(path.read_text(), module, str(path.relative_to(ROOT)), is_package)
    assert not problems, "imports against docs/architecture.md:\n" + "\n".join(problems)


def test_aiormq_only_in_links():
    """The links' extra arrow is theirs alone."""
    assert check_source("import aiormq\n", "amqp_server.links.shovel", "shovel.py") == []
    assert check_source("import aiormq\n", "amqp_server.amqp.channel", "channel.py") != []
    assert check_source("import aiormq\n", "amqp_server.linksx", "linksx.py") != []


def test_every_subpackage_has_a_rule():
    """A new room in amqp_server needs its arrows here (and in docs/architecture.md)."""
    rooms = {"amqp_server." + path.name for path in (ROOT / "amqp_server").iterdir()
             if (path / "__init__.py").exists()}
    assert rooms == set(SUBPACKAGES) - {"amqp_server"}


def test_nothing_imports_the_composition_root():
    found = [(path.relative_to(ROOT), target)
             for package in ALLOWED if package != "cli"
             for path, module, is_package in python_files(package)
             if not module.startswith("amqp_server.process")
             for _, target, _ in imported_modules(ast.parse(path.read_text()), module, is_package)
             if target and _within(target, ["amqp_server.process"])]
    assert not found


def test_the_walk_sees_the_real_imports():
    # guards against a walk that silently finds nothing
    files = list(python_files("amqp_server"))
    assert any(module == "amqp_server.amqp.framing" for _, module, _ in files)
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
    ("amqp_server.amqp.channel", "import cli\n", "cli"),
    ("amqp_server.amqp.channel", "from spark_sink import job\n", "spark_sink"),
    ("amqp_server.amqp.channel", "import pyspark.sql\n", "pyspark"),
    ("amqp_server.amqp.channel", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cli import x\n", "cli"),
    ("amqp_server.amqp.channel", "def f():\n    import aio_pika\n", "aio_pika"),
    ("amqp_server.amqp.channel", "import importlib\nm = importlib.import_module('cli.server')\n", "cli"),
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
    ("amqp_server.process.server", "import asyncio\nimport uvloop\nimport ssl\nfrom vhosts import Broker\n"
                                   "from routing import Destination\nfrom amqp_server.mqtt import protocol\n"
                                   "from amqp_server.amqp.protocol import AMQPProtocol\n"),
    ("amqp_server.amqp.channel", "from pamqp import frame\nfrom amqp_server.shared.config import BrokerConfig\n"),
    ("amqp_server.links.client", "import aiormq\nfrom amqp_server.amqp import framing\n"
                                 "from amqp_server.amqp.framing import FrameReader\n"),
    ("cli.server", "import yaml\nfrom amqp_server.process.server import run\nimport vhosts\n"),
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
