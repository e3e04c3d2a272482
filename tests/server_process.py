"""A hutch server (`python -m cli.server`) as a child process of the tests
and benchmarks: how it is started, where its log goes, how it is stopped.

conftest.py's `launch` starts a broker on free ports (port 0) and reads
them from its log; cluster_kit.Node starts a cluster node on fixed ports.
Both start it with `spawn` and are `ServerProcess`es.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def spawn(args, log_lines: list, env: dict | None = None, on_line=None, wrap: list = ()) -> subprocess.Popen:
    """`python -m cli.server *args` (after the command `wrap`, which runs it:
    `ip netns exec ...` for tests/partition_kit.py), run from the repository root so that this
    checkout's code is what runs, in the caller's environment without its
    HUTCH_* settings (which would override `args`), plus `env`. A daemon
    thread appends each line of its stderr (the log) to `log_lines` and hands
    it to `on_line`, then hands it "" once the stream ends (readline's end of
    file: the process exited)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
    environ.update(env or {})
    process = subprocess.Popen([*wrap, sys.executable, "-m", "cli.server", *args], cwd=ROOT, env=environ,
                               stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)

    def pump() -> None:
        for line in process.stderr:
            log_lines.append(line)
            if on_line is not None:
                on_line(line)
        if on_line is not None:
            on_line("")

    threading.Thread(target=pump, daemon=True).start()
    return process


class ServerProcess:
    """What a started server offers, however it was started: its AMQP URL,
    its log, and stopping it. A subclass has `process` (a Popen or None
    before it starts), `log_lines` (filled by `spawn`) and `port`."""

    stop_grace = 10.0  # seconds between SIGTERM and SIGKILL

    @property
    def url(self) -> str:
        return "amqp://guest:guest@127.0.0.1:%d/" % self.port

    @property
    def log(self) -> str:
        return "".join(self.log_lines)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL, and wait until it is gone."""
        self.process.kill()
        self.process.wait(10)

    def _signal_node(self, sig: int) -> None:
        """`sig` to the shard processes this process supervises, then to it."""
        pid = self.process.pid
        try:
            with open("/proc/%d/task/%d/children" % (pid, pid)) as found:
                shards = [int(child) for child in found.read().split()]
        except OSError:
            shards = []
        for each in [*shards, pid]:
            try:
                os.kill(each, sig)
            except ProcessLookupError:
                pass

    def crash(self) -> None:
        """SIGKILL the node whole at one instant, as a power cut would: the process and
        the shard processes it supervises (which a SIGKILL of the supervisor alone ends
        only a moment later, PR_SET_PDEATHSIG, while they go on serving). The shards
        go first: none lives on past its supervisor."""
        self._signal_node(signal.SIGKILL)
        self.process.wait(10)

    @contextlib.contextmanager
    def frozen(self):
        """The node whole stopped (SIGSTOP) inside the block: its data directory
        then holds what a crash at that instant would leave, and a copy of it
        is not torn by writes going on meanwhile."""
        self._signal_node(signal.SIGSTOP)
        try:
            yield
        finally:
            self._signal_node(signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM, and SIGKILL if it has not exited within `stop_grace`.
        SIGCONT first: a test may have stopped it (SIGSTOP), and a stopped
        process does not act on SIGTERM."""
        if self.running():
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(self.stop_grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
