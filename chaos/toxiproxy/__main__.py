"""`python -m raftlog.chaos.toxiproxy`: the bundled Toxiproxy server, with the flags of
`toxiproxy-server` that matter here (-host/-port/-seed/-config, also spelled with two dashes).
Prints one line, "toxiproxy listening on HOST:PORT", once the API answers; stops on SIGTERM or
SIGINT, closing every proxy."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

from .server import start_server


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m raftlog.chaos.toxiproxy",
                                     description="Toxiproxy-compatible TCP fault proxy")
    parser.add_argument("--host", "-host", default="127.0.0.1", help="API address to bind")
    parser.add_argument("--port", "-port", type=int, default=8474, help="API port (0: any)")
    parser.add_argument("--seed", "-seed", type=int, default=None,
                        help="seed for toxicity draws and jitter")
    parser.add_argument("--config", "-config", type=Path, default=None,
                        help="JSON file of proxies to create at start (as POST /populate)")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    server = await start_server(args.host, args.port, seed=args.seed)
    try:
        if args.config is not None:
            reply = await server.toxiproxy.populate(json.loads(args.config.read_text()))
            if reply.status != 201:
                print(f"toxiproxy: --config: {reply.body}", file=sys.stderr)
                return 1
        host, port = server.address
        print(f"toxiproxy listening on {host}:{port}", flush=True)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        await stopping.wait()
        return 0
    finally:
        await server.close()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    return asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
