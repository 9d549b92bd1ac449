"""Load one core in random bursts, as a browser or a video call does, for at most ``--seconds``.

``make test-busy`` starts two of these beside nbval (through ``with_busy_cores.sh``). A burst
spins the core for a random fraction of a second, then sleeps for another. The process ends by
itself after ``--seconds``, or as soon as the process that started it is gone, so it can never
outlive the run that needs it.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time


def spin(seconds: float) -> None:
    """Keep one core fully busy for ``seconds`` (pure Python arithmetic, no I/O)."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        for _ in range(10_000):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def run(seconds: float, max_on: float, max_off: float, seed: int | None,
        parent: int | None = None) -> int:
    """Alternate random bursts of spinning and sleeping until the time is up or ``parent`` is
    gone (default: the process that started this one); return the number of bursts."""
    rng = random.Random(seed)
    parent = os.getppid() if parent is None else parent
    deadline = time.monotonic() + seconds
    bursts = 0
    while time.monotonic() < deadline and os.getppid() == parent:
        spin(rng.uniform(0.05, max_on))
        time.sleep(rng.uniform(0.05, max_off))
        bursts += 1
    return bursts


def main(argv: list[str] | None = None) -> int:
    """``python tests/tools/busy.py [--seconds S] [--max-on S] [--max-off S] [--seed N]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3600.0,
                        help="stop after this many seconds at the latest (default 3600)")
    parser.add_argument("--max-on", type=float, default=0.6, help="longest burst of spinning")
    parser.add_argument("--max-off", type=float, default=0.6, help="longest pause")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--parent", type=int, default=None,
                        help="stop as soon as this process is no longer our parent")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        run(args.seconds, args.max_on, args.max_off, args.seed, args.parent)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
