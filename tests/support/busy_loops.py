"""Keep-alive connections that each send their next request the moment the answer lands: run as a separate
process (``python tests/support/busy_loops.py PORT N SECONDS KIND``), so that the probes a test makes
meanwhile are not slowed by the attacker's own interpreter.

KIND ``select``: each request is /metrics?name[]= naming every series name the daemon serves plus a random
one, so no selection cache can serve it (issue 30 review: 80 of them against a cap of 64 left no connection
idle and no request slow to arrive, and probes were reset). KIND ``gpus``: GET /v1/gpus."""

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
        query = "&".join("name[]=" + urllib.parse.quote(x) for x in [*names, f"x{random.getrandbits(48):x}"])
        return f"/metrics?{query}"

    async def loop() -> None:
        nonlocal answered
        while time.monotonic() < end:
            try:
                # from an address of its own, as a remote attacker is: the probes come from 127.0.0.1
                reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
                while time.monotonic() < end:
                    writer.write(f"GET {target()} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                    await _answer(reader)
                    answered += 1
                writer.close()
            except (OSError, asyncio.IncompleteReadError):
                await asyncio.sleep(0.05)  # shed: come back, as an attacker would

    await asyncio.gather(*(loop() for _ in range(n)))
    print(answered, flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]))
