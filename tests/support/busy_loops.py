"""Keep-alive connections that each send their next request the moment the answer lands: run as a separate
process (``python tests/support/busy_loops.py PORT N SECONDS KIND``), so that the probes a test makes
meanwhile are not slowed by the attacker's own interpreter.

KIND ``select``: each request is /metrics?name[]= naming every series name the daemon serves plus a random
one, so no selection cache can serve it (issue 30 review: 80 of them against a cap of 64 left no connection
idle and no request slow to arrive, and probes were reset). KIND ``gpus``: GET /v1/gpus. KIND ``spread``:
GET /healthz, four pipelined at a time, each connection from a loopback address of its own (review: 64 such
turned every newcomer away, since no address held more than the newcomer's)."""

from __future__ import annotations

import asyncio
import random
import sys
import time
import urllib.parse
import urllib.request


async def _answer(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)


async def main(port: int, n: int, seconds: float, kind: str) -> None:
    names: list[str] = []
    if kind == "select":
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        samples = (line for line in text.splitlines() if line[:1] not in "#")
        names = sorted({line.split("{")[0].split(" ")[0] for line in samples})[:255]
    end = time.monotonic() + seconds
    answered = 0

    def target() -> str:
        if kind == "gpus":
            return "/v1/gpus"
        if kind == "spread":
            return "/healthz"
        query = "&".join("name[]=" + urllib.parse.quote(x) for x in [*names, f"x{random.getrandbits(48):x}"])
        return f"/metrics?{query}"

    async def loop(i: int) -> None:
        nonlocal answered
        # from an address other than the probes' (127.0.0.1): one for all, or (spread) one each, as many
        # hosts would; spread loops pipeline four requests at a time
        source = f"127.0.{2 + i // 250}.{2 + i % 250}" if kind == "spread" else "127.0.0.2"
        depth = 4 if kind == "spread" else 1
        while time.monotonic() < end:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
                while time.monotonic() < end:
                    writer.write(f"GET {target()} HTTP/1.1\r\nHost: x\r\n\r\n".encode() * depth)
                    for _ in range(depth):
                        await _answer(reader)
                    answered += depth
                writer.close()
            except (OSError, asyncio.IncompleteReadError):
                await asyncio.sleep(0.05)  # shed: come back, as an attacker would

    await asyncio.gather(*(loop(i) for i in range(n)))
    print(answered, flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]))
