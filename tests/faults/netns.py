"""Simulated hosts for the multi-host test: each is a network namespace joined to this
machine by a veth pair, with its own hostname (a UTS namespace) for the processes run in
it. Names are unique per run, and everything is torn down, even when the test fails (and
what a killed run left behind is removed by the next)."""

from __future__ import annotations

import functools
import ipaddress
import os
import random
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

PREFIX = "laneway-"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@dataclass(frozen=True)
class Host:
    hostname: str
    netns: str
    veth: str  # the host-side end
    gateway: str  # the host-side end's address: what the host reaches this machine at
    address: str  # the namespace's end

    def argv(self, argv: list[str]) -> list[str]:
        """A command line that runs `argv` on this host (its network, its hostname)."""
        return [
            "ip", "netns", "exec", self.netns,
            "unshare", "--uts", "--",
            "sh", "-c", 'hostname "$0" && exec "$@"', self.hostname, *argv,
        ]  # fmt: skip

    def cut(self) -> None:
        """Pull the cable: packets between the host and this machine are dropped, and no
        connection is told (nothing is reset)."""
        _ip("link", "set", self.veth, "down")

    def restore(self) -> None:
        """Plug the cable back in: the connections that were cut carry on where they were."""
        _ip("link", "set", self.veth, "up")


@functools.cache
def unavailable() -> str | None:
    """Why this machine cannot make hosts, or None when it can. It tries every piece the
    test uses, on a throwaway host: a namespace, a veth pair with one end moved into it and
    addresses on both, and a process run there under its own hostname (`ip netns exec`,
    `unshare --uts`, `hostname`). Asked once per run, by the test's fixture, not on import."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces (ip netns)"
    missing = [tool for tool in ("ip", "unshare", "hostname", "sh") if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)} (iproute2, util-linux, hostname)"
    try:
        with hosts(1) as (host,):
            ran = subprocess.run(
                host.argv(["hostname"]), capture_output=True, text=True, timeout=30
            )
            host.cut()
            host.restore()
    except subprocess.CalledProcessError as exc:
        return f"cannot make a host: `{' '.join(exc.cmd)}` says {exc.stderr.strip()!r}"
    except subprocess.TimeoutExpired as exc:
        return f"cannot run a process on a host: `{' '.join(exc.cmd)}` did not end in 30 s"
    if ran.returncode != 0 or ran.stdout.strip() != host.hostname:
        said = (ran.stderr or ran.stdout).strip()
        return f"cannot run a process on a host under its own hostname: {said!r}"
    return None


def _free_subnet(taken: set[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """A /30 in 10.213.0.0/16 that no interface of this machine is on."""
    used = {
        ipaddress.ip_interface(addr).network
        for addr in re.findall(r"inet (\S+)", _ip("-4", "-o", "addr", "show").stdout)
    }
    while True:
        net = ipaddress.ip_network(f"10.213.{random.randrange(256)}.{4 * random.randrange(64)}/30")
        if net not in taken and not any(net.overlaps(u) for u in used):
            return net


def remove_stale() -> None:
    """Delete the namespaces of earlier runs whose process is gone (a killed test run)."""
    for line in _ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        match = re.fullmatch(rf"{PREFIX}(\d+)-\w+", name)
        if match and not os.path.exists(f"/proc/{match.group(1)}"):
            _ip("netns", "del", name, check=False)


def _make(index: int, token: str, net: ipaddress.IPv4Network, stack: ExitStack) -> Host:
    gateway, address = (str(a) for a in list(net.hosts())[:2])
    host = Host(
        hostname=f"host{index}-{token}",
        netns=f"{PREFIX}{os.getpid()}-{token}{index}",
        veth=f"lw{token}{index}h",
        gateway=gateway,
        address=address,
    )
    inside = f"lw{token}{index}n"
    _ip("netns", "add", host.netns)
    stack.callback(_ip, "netns", "del", host.netns, check=False)
    _ip("link", "add", host.veth, "type", "veth", "peer", "name", inside)
    # Deleting the namespace deletes its end and so the pair; this is for a failure between.
    stack.callback(_ip, "link", "del", host.veth, check=False)
    _ip("link", "set", inside, "netns", host.netns)
    _ip("addr", "add", f"{gateway}/30", "dev", host.veth)
    _ip("link", "set", host.veth, "up")
    for args in (
        ("addr", "add", f"{address}/30", "dev", inside),
        ("link", "set", inside, "up"),
        ("link", "set", "lo", "up"),
    ):
        _ip("netns", "exec", host.netns, "ip", *args)
    return host


@contextmanager
def hosts(count: int) -> Iterator[list[Host]]:
    """`count` hosts, each on its own /30 with this machine; gone again on exit."""
    remove_stale()
    token = secrets.token_hex(3)
    with ExitStack() as stack:
        made: list[Host] = []
        taken: set[ipaddress.IPv4Network] = set()
        for index in range(count):
            net = _free_subnet(taken)
            taken.add(net)
            made.append(_make(index, token, net, stack))
        yield made
