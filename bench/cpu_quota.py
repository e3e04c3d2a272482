"""CPU quotas with cgroups: a process, and whatever it forks afterwards, held to a fraction of a core.

bench/scale.py simulates a machine's cores with them (docs/scaling.md, "Measuring"). The cpu
controller of cgroup v1 where it is mounted (`/sys/fs/cgroup/cpu/<group>/cpu.cfs_quota_us` over
`cpu.cfs_period_us`), else cgroup v2's `cpu.max` ("QUOTA PERIOD" in `/sys/fs/cgroup/<group>/`,
with `+cpu` in the root's `cgroup.subtree_control`). CFS hands a group `quota` µs of CPU time per
`period` µs, summed over all its threads, then throttles it until the next period: Q = 0.25 is a
quarter of one core however many threads the group runs. Needs root.

Groups are named `hutch-scale-<pid of the creating process>-<name>` directly under the
hierarchy's root, so `remove_stale()` can delete what a killed run left behind. Removing a group
first moves any process still in it back to the cgroup of the process that created it (a group
with members cannot be removed).
"""
from __future__ import annotations

import os
import time

PERIOD_US = 100_000
V1 = "/sys/fs/cgroup/cpu"
V2 = "/sys/fs/cgroup"
PREFIX = "hutch-scale-"


class CgroupError(RuntimeError):
    pass


def hierarchy() -> tuple[str, int]:
    """(root directory, version) of the cpu controller's hierarchy; CgroupError when there is none."""
    if os.path.isfile(os.path.join(V1, "cpu.cfs_quota_us")):
        return V1, 1
    try:
        with open(os.path.join(V2, "cgroup.controllers")) as f:
            if "cpu" in f.read().split():
                return V2, 2
    except OSError:
        pass
    raise CgroupError("no cgroup cpu controller: neither %s/cpu.cfs_quota_us (v1) nor cpu in "
                      "%s/cgroup.controllers (v2)" % (V1, V2))


def _own_group(version: int) -> str:
    """The cgroup path (relative to the hierarchy's root) of this process for the cpu controller."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _id, controllers, path = line.rstrip("\n").split(":", 2)
            if (version == 1 and "cpu" in controllers.split(",")) or (version == 2 and _id == "0"):
                return path
    return "/"


def _write(path: str, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as exc:
        raise CgroupError("cannot write %r to %s: %s" % (value, path, exc)) from exc


class CpuQuota:
    """One cgroup of the cpu controller. `set(cores)`: the quota in cores (None: unlimited);
    `add(pid)` moves a process (all its threads) in; `enter()` moves the calling process (a
    `preexec_fn`: the broker starts inside the group, and what it forks is born there)."""

    def __init__(self, name: str) -> None:
        self.root, self.version = hierarchy()
        self.name = "%s%d-%s" % (PREFIX, os.getpid(), name)
        self.path = os.path.join(self.root, self.name)
        self._home = os.path.join(self.root, _own_group(self.version).lstrip("/"))
        if self.version == 2:
            with open(os.path.join(self.root, "cgroup.subtree_control")) as f:
                if "cpu" not in f.read().split():
                    _write(os.path.join(self.root, "cgroup.subtree_control"), "+cpu")
        try:
            os.mkdir(self.path)
        except OSError as exc:
            raise CgroupError("cannot create the cgroup %s: %s" % (self.path, exc)) from exc

    def set(self, cores: float | None) -> None:
        if self.version == 1:
            _write(os.path.join(self.path, "cpu.cfs_period_us"), str(PERIOD_US))
            _write(os.path.join(self.path, "cpu.cfs_quota_us"),
                   "-1" if cores is None else str(int(cores * PERIOD_US)))
        else:
            _write(os.path.join(self.path, "cpu.max"),
                   "%s %d" % ("max" if cores is None else int(cores * PERIOD_US), PERIOD_US))

    def cores(self) -> float | None:
        """The quota read back from the kernel, in cores (None: unlimited)."""
        if self.version == 1:
            with open(os.path.join(self.path, "cpu.cfs_quota_us")) as f:
                quota = int(f.read())
            with open(os.path.join(self.path, "cpu.cfs_period_us")) as f:
                period = int(f.read())
            return None if quota < 0 else quota / period
        with open(os.path.join(self.path, "cpu.max")) as f:
            quota, period = f.read().split()
        return None if quota == "max" else int(quota) / int(period)

    def add(self, pid: int) -> None:
        _write(os.path.join(self.path, "cgroup.procs"), str(pid))

    def enter(self) -> None:
        self.add(os.getpid())

    def pids(self) -> list[int]:
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                return [int(line) for line in f if line.strip()]
        except OSError:
            return []

    def throttled(self) -> tuple[int, int]:
        """(enforcement periods in which the group ran, periods in which its quota ran out and it
        was throttled) so far."""
        stat = {}
        with open(os.path.join(self.path, "cpu.stat")) as f:
            for line in f:
                key, value = line.split()
                stat[key] = int(value)
        return stat.get("nr_periods", 0), stat.get("nr_throttled", 0)

    def remove(self) -> None:
        """Moves what is left in the group back to the creator's cgroup, then deletes the group."""
        _remove(self.path, self._home)


def _remove(path: str, home: str) -> None:
    for attempt in range(50):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                left = [line.strip() for line in f if line.strip()]
        except FileNotFoundError:
            return
        for pid in left:
            try:
                _write(os.path.join(home, "cgroup.procs"), pid)
            except CgroupError:
                pass  # it exited meanwhile
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)  # a process leaving the group is not gone from it at once
    raise CgroupError("cannot remove the cgroup %s" % path)


def remove_stale() -> list[str]:
    """Deletes the groups of earlier runs whose creating process is gone (a SIGKILLed bench)."""
    root, version = hierarchy()
    home = os.path.join(root, _own_group(version).lstrip("/"))
    removed = []
    for name in os.listdir(root):
        if not name.startswith(PREFIX):
            continue
        owner = name[len(PREFIX):].split("-", 1)[0]
        if owner.isdigit() and not os.path.exists("/proc/%s" % owner):
            _remove(os.path.join(root, name), home)
            removed.append(name)
    return removed


class QuotaSet:
    """The groups of one broker run: created by `new`, all removed on leaving the `with`."""

    def __init__(self) -> None:
        self.groups: list[CpuQuota] = []

    def new(self, name: str) -> CpuQuota:
        group = CpuQuota(name)
        self.groups.append(group)
        return group

    def __enter__(self) -> "QuotaSet":
        return self

    def __exit__(self, *exc) -> None:
        errors = []
        for group in reversed(self.groups):
            try:
                group.remove()
            except CgroupError as err:
                errors.append(str(err))
        self.groups.clear()
        if errors and exc[0] is None:
            raise CgroupError("; ".join(errors))
