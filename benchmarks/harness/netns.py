"""An emulated cluster: one network namespace per rank, joined through a switch namespace.

    rank ns r:  eth0 (10.123.0.<r+1>/24)  <-- veth -->  switch ns: p<r>, attached to bridge br0

Each veth is shaped with ``tc tbf`` on both ends (full duplex at ``rate``; no netem in this
kernel, so no added delay). Names carry the creating pid, for :func:`remove_stale`.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Cluster", "LinkSpec", "ready_or_skip", "remove_stale", "skip_reason"]

PREFIX = "scbench"
SUBNET = "10.123.0"
IFNAME = "eth0"
_NAME_RE = re.compile(rf"^{PREFIX}-(\d+)-[0-9a-f]+-(?:sw|r\d+)$")


@dataclass(frozen=True)
class LinkSpec:
    """A tbf shaper: ``rate_mbit`` per direction; ``latency_ms`` bounds its queue."""

    rate_mbit: float
    latency_ms: float = 20.0

    @property
    def label(self) -> str:
        r = self.rate_mbit
        return f"{r / 1000:g}gbit" if r >= 1000 else f"{r:g}mbit"

    def tbf_args(self) -> list[str]:
        # burst: at least veth's 64 KiB GSO super-packets twice, and a kernel tick at the rate
        burst = max(128 * 1024, int(self.rate_mbit * 1e6 / 8 / 100))  # (HZ >= 100)
        return ["tbf", "rate", f"{self.rate_mbit:g}mbit", "burst", str(burst),
                "latency", f"{self.latency_ms:g}ms"]  # fmt: skip


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def skip_reason() -> str | None:
    """Why the emulated cluster cannot run here, or None when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "not root: the emulated cluster needs network namespaces (run it as root)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) not found: the emulated cluster needs ip and tc"
    probe = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}-sw"
    try:
        _run(["ip", "netns", "add", probe])
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        return f"cannot create a network namespace: {err}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


def remove_stale() -> list[str]:
    """Delete namespaces left by benchmark runs whose process no longer exists."""
    names = [ln.split()[0] for ln in _run(["ip", "netns", "list"]).splitlines() if ln.strip()]
    stale = [n for n in names if (m := _NAME_RE.match(n)) and not Path(f"/proc/{m[1]}").exists()]
    for name in stale:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    return stale


def ready_or_skip(bench: str, out: Path) -> bool:
    """True when namespaces can be built (a killed run's leftovers removed); else False, with
    why said and written to ``out`` as ``{"skipped": why}`` (so reports can tell)."""
    if reason := skip_reason():
        print(f"{bench} SKIPPED: {reason}")
        out.write_text(json.dumps({"skipped": reason}, indent=1))
        return False
    if stale := remove_stale():
        print(f"removed stale namespaces: {', '.join(stale)}")
    return True


class Cluster:
    """W rank namespaces on one shaped switch; a context manager that always tears down."""

    def __init__(self, world_size: int, link: LinkSpec | None) -> None:
        if not 1 <= world_size <= 200:
            raise ValueError(f"world_size must be in [1, 200], got {world_size}")
        self.world_size, self.link = world_size, link
        tag = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"
        self.switch_ns = f"{tag}-sw"
        self.rank_ns = [f"{tag}-r{r}" for r in range(world_size)]
        self.addrs = [f"{SUBNET}.{r + 1}" for r in range(world_size)]
        self.ifname, self._created = IFNAME, []

    def __enter__(self) -> Cluster:
        atexit.register(self.down)
        try:
            self._add_ns(self.switch_ns)
            _run(["ip", "-n", self.switch_ns, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", self.switch_ns, "link", "set", "br0", "up"])
            for r, ns in enumerate(self.rank_ns):
                self._add_ns(ns)
                port = f"p{r}"
                _run(["ip", "link", "add", IFNAME, "netns", ns, "type", "veth",
                      "peer", "name", port, "netns", self.switch_ns])  # fmt: skip
                _run(["ip", "-n", self.switch_ns, "link", "set", port, "master", "br0"])
                _run(["ip", "-n", self.switch_ns, "link", "set", port, "up"])
                _run(["ip", "-n", ns, "addr", "add", f"{self.addrs[r]}/24", "dev", IFNAME])
                _run(["ip", "-n", ns, "link", "set", IFNAME, "up"])
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
                if self.link is not None:
                    for where, dev in ((ns, IFNAME), (self.switch_ns, port)):
                        _run(["ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev,
                              "root", *self.link.tbf_args()])  # fmt: skip
        except BaseException:
            self.down()
            raise
        return self

    def _add_ns(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self._created.append(name)

    def down(self) -> None:
        """Delete every namespace this cluster created; safe to call twice."""
        while self._created:
            name = self._created.pop()
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)

    def __exit__(self, *exc: object) -> None:
        self.down()
