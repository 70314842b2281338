"""A TCP relay on 127.0.0.1 that delays each direction by a fixed time: a WAN round trip
on loopback, where netem (tc qdisc) is not available.

    python -m bench.relay LISTEN_PORT TARGET_PORT DELAY_MS     # prints "ready" once listening

Every chunk read from one side is written to the other DELAY_MS after it arrived
(order kept). Reads are eager and the queue unbounded, so the relay itself adds
latency but no bandwidth limit and no window of its own: what a transfer achieves
through it is bounded by its own windows and round trips, as over a long fat link.
Runs as its own process so its CPU does not share a GIL with the benchmark.
"""
from __future__ import annotations

import asyncio
import sys

CHUNK = 1 << 20


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read() -> None:
        try:
            while True:
                data = await reader.read(CHUNK)
                await queue.put((loop.time() + delay, data))
                if not data:
                    return
        except (ConnectionError, OSError):
            await queue.put((loop.time(), b""))

    async def write() -> None:
        try:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            return

    await asyncio.gather(read(), write())


async def _serve(listen: int, target: int, delay: float) -> None:
    async def handle(r1: asyncio.StreamReader, w1: asyncio.StreamWriter) -> None:
        try:
            r2, w2 = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            w1.close()
            return
        try:
            await asyncio.gather(_pump(r1, w2, delay), _pump(r2, w1, delay))
        finally:
            for w in (w1, w2):
                w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    listen, target, delay_ms = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    asyncio.run(_serve(listen, target, delay_ms / 1000.0))


if __name__ == "__main__":
    main()
