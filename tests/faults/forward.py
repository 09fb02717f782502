"""A small TCP forwarder: listens on an address of this machine and passes each connection
on to a target, byte for byte. The multi-host test runs one per simulated host, on the
host side of its veth pair, so workers inside a network namespace reach Redis and
Postgres, which listen on 127.0.0.1 only (iptables' DNAT to 127.0.0.1 would need
route_localnet and the iptables tools; this needs nothing).

    python tests/faults/forward.py --listen 10.213.0.1 127.0.0.1:5432 127.0.0.1:6379

prints `FORWARD {"127.0.0.1:5432": port, ...}` (the ports it listens on), then serves
until it is killed. `--port N` listens on N (one target only): a forwarder started again on
the same port is a server that came back, as after a restart."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

CHUNK = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _serve_one(host: str, port: int, reader, writer) -> None:  # noqa: ANN001
    try:
        up_reader, up_writer = await asyncio.open_connection(host, port)
    except OSError:
        writer.close()
        return
    # Either side closing closes both: Redis and Postgres clients never half-close.
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def forward(listen: str, targets: list[str], listen_port: int = 0) -> None:
    ports = {}
    servers = []
    for target in targets:
        host, port = target.rsplit(":", 1)

        async def serve(reader, writer, host=host, port=int(port)):  # noqa: ANN001, ANN202
            await _serve_one(host, port, reader, writer)

        server = await asyncio.start_server(serve, listen, listen_port, reuse_address=True)
        servers.append(server)
        ports[target] = server.sockets[0].getsockname()[1]
    print("FORWARD " + json.dumps(ports), flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="the address to listen on")
    parser.add_argument("--port", type=int, default=0, help="the port (one target only)")
    parser.add_argument("targets", nargs="+", help="host:port to forward to")
    args = parser.parse_args(argv)
    if args.port and len(args.targets) != 1:
        parser.error("--port takes one target")
    asyncio.run(forward(args.listen, args.targets, args.port))


if __name__ == "__main__":
    main(sys.argv[1:])
