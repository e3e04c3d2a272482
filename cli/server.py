"""`hutch-server`: load settings, configure logging, run the broker until signalled.

Settings errors are reported (exit status 2, no traceback) before the server
package is imported, so a bad configuration is diagnosed even if the broker
itself cannot start.
"""
from __future__ import annotations

import functools
import logging
import os
import sys

from cli.settings import SettingsError, load_settings

LOG_FORMAT = "%(asctime)s [%(levelname)s] %(name)s: %(message)s"


def main(argv: list[str] | None = None) -> int:
    try:
        config = load_settings(argv, os.environ)
    except SettingsError as exc:
        print(f"hutch-server: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(stream=sys.stderr, level=config.log_level.upper(), format=LOG_FORMAT)

    from amqp_server.process.server import claim_data_directory, event_loop_runner, run, serve
    from amqp_server.process.shards import Supervisor, check_shard_dirs, shard_count
    from amqp_server.shared.errors import ListenError

    try:
        event_loop_runner(config)  # refused before the data directory or any port is touched
        # Locked before anything reads or writes it: a second node on it is refused here, and the
        # default shard count reads what the shards hold only once no other node can change it.
        directory = claim_data_directory(config.data_dir)
        config.shards = shard_count(config)
        check_shard_dirs(config.data_dir, config.shards)
        if config.shards > 1:
            if config.cluster.enabled:  # each shard its group's member (docs/scaling.md)
                from amqp_server.process.cluster import serve_shard
            else:
                from amqp_server.process.server import serve_shard
            return Supervisor(config, serve_shard, directory).run()
        if config.cluster.enabled:
            from amqp_server.process.cluster import serve_node

            run(config, serve_node)  # the node's broker opens the directory this process holds locked
        else:
            run(config, functools.partial(serve, data_directory=directory))
    except ListenError as exc:
        print(f"hutch-server: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
