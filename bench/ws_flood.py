"""A viewer flooding websocket frames against the ASGI servers, and what another user pays.

    .venv/bin/python bench/ws_flood.py [--seconds 8] [--attackers 0,1,3] [--repeat 2]

For each server -- daphne, uvicorn as it comes, uvicorn with config.websocket's protocol (the
production command of docs/operations.md) -- alternated, `--repeat` times: a logged-in viewer's
attacker processes open /ws/live/ and write `{"screen": ...}` frames as fast as the server takes
them, never minding the close (4429) the consumer sends them; `--reconnect` makes each attacker
open a new socket whenever one is cut (and give up on a write after 0.1 s). Meanwhile another
client GETs the login page every 0.1 s: its latency (p50 / p95 / max) is what the flood costs
everybody else on that server. Also: what the attackers could write (MB; with a bounded server
most of it sat in the kernel's buffers and was thrown away unread), the server's CPU seconds and
its RSS at the end. Attackers, server and victim share the machine's cores.
"""

import argparse
import base64
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.protocol import RESULTS_DIR, uptime  # noqa: E402
from bench.systems import palisade_database, write_report  # noqa: E402

DB = "palisade_bench_ws_flood"
VENV = ROOT / ".venv" / "bin"
SERVERS = {
    "daphne": [str(VENV / "daphne"), "-b", "127.0.0.1", "-p", "{port}"],
    "uvicorn": [str(VENV / "uvicorn"), "--host", "127.0.0.1", "--port", "{port}",
                "--lifespan", "off", "--log-level", "warning"],
    "uvicorn + config.websocket": [str(VENV / "uvicorn"), "--host", "127.0.0.1", "--port",
                                   "{port}", "--lifespan", "off", "--log-level", "warning",
                                   "--ws", "config.websocket:BoundedWebSocketProtocol"],
}  # fmt: skip


def session_cookie() -> str:
    """A superuser's session, as a browser holding it would send it."""
    from django.contrib.auth.models import User
    from django.test import Client

    user = User.objects.create_superuser("flood", password="flood")
    client = Client()
    client.force_login(user)
    return str(client.cookies["sessionid"].value)


def frame(text: str) -> bytes:
    payload, mask = text.encode(), b"\x01\x02\x03\x04"
    assert len(payload) < 126
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x81, 0x80 | len(payload)]) + mask + masked


def attacker(port: int, cookie: str, reconnect: bool, seconds: float, out: Any) -> None:
    flood = frame(json.dumps({"screen": {"page": "jobs"}})) * 2000
    sent = conns = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sock = socket.create_connection(("127.0.0.1", port))
        try:
            conns += 1
            key = base64.b64encode(os.urandom(16)).decode()
            sock.sendall(
                (
                    f"GET /ws/live/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                    f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                    f"Sec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1:{port}\r\n"
                    f"Cookie: sessionid={cookie}\r\n\r\n"
                ).encode()
            )
            if not sock.recv(4096).startswith(b"HTTP/1.1 101"):
                raise RuntimeError("the attacker's handshake was refused")
            sock.settimeout(0.1 if reconnect else 1.0)
            while time.monotonic() < end:
                sock.sendall(flood)
                sent += len(flood)
        except OSError:
            pass
        finally:
            sock.close()
        if not reconnect:
            break
    out.put((sent, conns))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(
    server: str, env: dict[str, str], cookie: str, attackers: int, reconnect: bool, seconds: float
) -> dict[str, Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cmd = [a.format(port=port) for a in SERVERS[server]] + ["config.asgi:application"]
    log = RESULTS_DIR / "logs" / "ws_flood_server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
        start_new_session=True,
    )  # fmt: skip
    login = f"http://127.0.0.1:{port}/login/"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(login, timeout=2).read()  # noqa: S310 (our local server)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"{server} did not serve: {log.read_text()}") from None
                time.sleep(0.1)  # the poll interval of a deadline-bound wait
        cpu_start = cpu_seconds(proc.pid)
        out: Any = mp.Queue()
        procs = [
            mp.Process(target=attacker, args=(port, cookie, reconnect, seconds, out))
            for _ in range(attackers)
        ]
        for p in procs:
            p.start()
        latencies, errors = [], 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.perf_counter()
            try:
                urllib.request.urlopen(login, timeout=10).read()  # noqa: S310
            except OSError:
                errors += 1
            latencies.append((time.perf_counter() - t) * 1000)
            time.sleep(0.1)  # the victim's pace: a page every 0.1 s
        sent = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join()
        status = Path(f"/proc/{proc.pid}/status").read_text()
        latencies.sort()
        return {
            "server": server,
            "attackers": attackers,
            "reconnect": reconnect,
            "victim_ms": {
                "p50": statistics.median(latencies),
                "p95": latencies[int(len(latencies) * 0.95)],
                "max": latencies[-1],
                "n": len(latencies),
                "errors": errors,
            },
            "attackers_wrote_mb": sum(s for s, _ in sent) / 1e6,
            "connections": sum(c for _, c in sent),
            "server_cpu_s": cpu_seconds(proc.pid) - cpu_start,
            "server_rss_mb": int(status.split("VmRSS:")[1].split()[0]) // 1024,
        }
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--server", default=os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
    )
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--attackers", default="0,1,3")
    p.add_argument("--reconnect", action="store_true")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--output", type=Path, default=RESULTS_DIR / "ws_flood.json")
    args = p.parse_args()
    started, load_start = datetime.now(UTC), uptime()
    # This process signs the session the server reads: the same key and settings.
    os.environ.update(
        SECRET_KEY="bench-ws-flood-" + "x" * 40,
        DJANGO_DEBUG="0",
        ALLOWED_HOSTS="127.0.0.1",
        PALISADE_ENV_FILE="none",
    )
    env = palisade_database(args.server, DB)  # sets Django up in this process too
    cookie = session_cookie()
    runs = []
    for _ in range(args.repeat):
        for k in [int(x) for x in args.attackers.split(",")]:
            for server in SERVERS:
                r = one_run(server, env, cookie, k, args.reconnect, args.seconds)
                runs.append(r)
                v = r["victim_ms"]
                print(f"{server:28} attackers {k}{' reconnecting' if args.reconnect else ''}: "
                      f"victim p50 {v['p50']:.0f} / p95 {v['p95']:.0f} / max {v['max']:.0f} ms "
                      f"(n {v['n']}, errors {v['errors']}); attackers wrote "
                      f"{r['attackers_wrote_mb']:.1f} MB on {r['connections']} sockets; server "
                      f"CPU {r['server_cpu_s']:.1f} s, RSS {r['server_rss_mb']} MB",
                      flush=True)  # fmt: skip
    write_report(args.output, started, load_start, args, runs=runs)


if __name__ == "__main__":
    main()
