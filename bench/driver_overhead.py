"""How much does the load generator itself cost? The driver against an instant fake engine.

The fake engine yields tokens with no delay, so the whole time is the driver's (and asyncio's) own
work: records, timestamps, progress callbacks. Printed: the token and request rates the driver sustains
alone, and the share of one core it would take at a given real engine rate (--engine-tok-s, e.g. the
vLLM tok/s the lab measured). Usage: python -m bench.driver_overhead [--engine-tok-s 120]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from lab.engines.base import GenRequest
from lab.engines.fake import FakeEngine
from lab.load.driver import run_users


def driver_rates(users: int, requests: int, tokens: int) -> tuple[float, float]:
    """(tokens/s, requests/s) the driver sustains against an instant engine."""
    engine = FakeEngine(token_delay_s=0.0)
    batch = [GenRequest(f"r{i}", tuple(range(32)), tokens) for i in range(requests)]
    seen = []
    start = time.perf_counter()
    asyncio.run(run_users(engine, iter(batch), users, on_record=seen.append))
    elapsed = time.perf_counter() - start
    return requests * tokens / elapsed, requests / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-tok-s", type=float, default=120.0,
                        help="a real engine's output tok/s to compare with")
    args = parser.parse_args()
    print(f"{'users':>5} {'driver tok/s':>13} {'driver req/s':>13} {'core share at engine rate':>26}")
    for users in (1, 5, 10, 20):
        tok_s, req_s = driver_rates(users, requests=400, tokens=128)
        print(f"{users:>5} {tok_s:>13.0f} {req_s:>13.0f} {args.engine_tok_s / tok_s:>25.2%}")


if __name__ == "__main__":
    main()
