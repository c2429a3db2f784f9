"""The entry points' shared command line: parser, start of a timing run, the JSON written."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import quiet
from benchmarks.harness.netns import ready_or_skip

__all__ = ["ROOT", "parser", "start", "write_json"]

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_OPTIONS = ("max_load", "max_other_cores", "retries", "settle_s")


def parser(doc: str, out: Path | None = None, *, timing: bool = True,
           cluster: bool = False) -> argparse.ArgumentParser:  # fmt: skip
    """Described by ``doc``'s first line; with the quiet protocol's and the launch options."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    if out is not None:
        p.add_argument("--out", type=Path, default=out)
    if cluster:
        p.add_argument("--loopback", action="store_true",
                       help="no namespaces or shaping (functional checks; not a speed measure)")  # fmt: skip
        p.add_argument("--timeout", type=float, default=900.0, help="seconds per launch")
        p.add_argument("--data-root", type=lambda d: Path(d).resolve(), default=str(ROOT / "data"))
    if timing:  # the quiet protocol's: Protocol's fields
        g = p.add_argument_group("quiet-machine protocol (benchmarks/harness/quiet.py)")
        g.add_argument("--allow-busy", action="store_true",
                       help="run beside studies/tests/benchmarks (disturbed rounds are marked noisy)")  # fmt: skip
        for name in PROTOCOL_OPTIONS:
            default = getattr(quiet.Protocol, name)
            g.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default,
                           help="default %(default)s")  # fmt: skip
    return p


def start(bench: str, args: Any, *, cluster: bool = False) -> quiet.Protocol | None:
    """The run's quiet protocol, after refusing to time beside busy work; None (the skip
    record written to ``args.out``) when ``cluster`` is wanted and cannot be built."""
    if args.retries < 0 or args.max_load <= 0 or args.settle_s < 0:
        raise SystemExit(f"quiet protocol: --retries {args.retries}, --max-load {args.max_load}, "
                         f"--settle-s {args.settle_s}: need retries >= 0, max-load > 0, "
                         "settle-s >= 0")  # fmt: skip
    protocol = quiet.Protocol(allow_busy=args.allow_busy,
                              **{k: getattr(args, k) for k in PROTOCOL_OPTIONS})  # fmt: skip
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # teardown runs on a killed make
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if cluster and not ready_or_skip(bench, args.out):
        return None
    quiet.require_quiet(bench, protocol.allow_busy)
    return protocol


def write_json(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc, indent=1))
    print(f"wrote {path}")
