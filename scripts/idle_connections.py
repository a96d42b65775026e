#!/usr/bin/env python3
"""Holds thousands of idle and dribbling connections against `runtime serve` while probing
`/health`, then sends SIGTERM with the flood still on and times the exit.

Not a CI test (it needs tens of thousands of file descriptors, spread over `--processes`
client processes so that each stays within the open-file limit). It starts the server
itself:

    python3 scripts/idle_connections.py --connections 20000 --seconds 60 -- \\
        target/release/runtime serve --port 0 --artifacts artifacts/smollm2-135m-instruct

Half the connections send nothing; the other half send a request head one byte every few
seconds, never finishing. The server keeps at most its `--max-connections`, closing the
longest-waiting ones; with `--reopen` each connection it closes is opened again at once (a
connection storm: the client holds `--connections` sockets throughout). `/health` is probed
every 100 ms on a fresh connection; the report gives the probes' latencies and any that took
over 1 s.
"""

import argparse
import multiprocessing
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--connections", type=int, default=20000)
    p.add_argument("--processes", type=int, default=4, help="client processes sharing the connections")
    p.add_argument("--seconds", type=float, default=60, help="flood duration before SIGTERM")
    p.add_argument("--dribble-every", type=float, default=3.0, help="seconds between a dribbler's bytes")
    p.add_argument("--reopen", action="store_true", help="open again each connection the server closes")
    p.add_argument("server", nargs=argparse.REMAINDER, help="-- then the server command")
    args = p.parse_args()
    if args.server and args.server[0] == "--":
        args.server = args.server[1:]
    if not args.server:
        p.error("give the server command after --")
    return args


def raise_file_limit(needed):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + 100
    if hard < want:
        sys.exit(f"error: a client process needs {want} open files, the hard limit is {hard}: use more --processes")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))


def start_server(command):
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    line = server.stdout.readline().strip()
    prefix = "listening on http://"
    if not line.startswith(prefix):
        server.kill()
        sys.exit(f"error: unexpected first line {line!r}")
    host, port = line[len(prefix):].rsplit(":", 1)
    address = (host, int(port))
    deadline = time.time() + 120
    while probe(address, 5.0)[0] != 200:
        if time.time() > deadline:
            server.kill()
            sys.exit("error: /health not 200 after 120 s")
        time.sleep(0.2)
    return server, address


def probe(address, timeout):
    """(status, seconds) of GET /health on a fresh connection; status 0 if it failed."""
    started = time.monotonic()
    try:
        with socket.create_connection(address, timeout=timeout) as s:
            s.settimeout(max(0.001, timeout - (time.monotonic() - started)))
            s.sendall(f"GET /health HTTP/1.1\r\nHost: {address[0]}:{address[1]}\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
    except (OSError, ValueError, IndexError):
        status = 0
    return status, time.monotonic() - started


class Flood:
    """`count` client sockets, reopened when the server closes them."""

    def __init__(self, address, count, dribble_every, reopen, stop, worker):
        self.address, self.count, self.dribble_every, self.reopen = address, count, dribble_every, reopen
        self.selector = selectors.DefaultSelector()
        self.sockets = {}  # socket -> [kind, next byte time, head started]
        self.opened = self.closed_by_server = self.connect_errors = 0
        self.stop = stop
        self.source = worker

    def open_one(self, index):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        # Spread over source addresses: one address has only ~28k ephemeral ports.
        self.source += 1
        s.bind((f"127.0.0.{2 + self.source % 8}", 0))
        err = s.connect_ex(self.address)
        if err not in (0, 115):  # EINPROGRESS
            s.close()
            self.connect_errors += 1
            return
        kind = "dribble" if index % 2 else "idle"
        self.sockets[s] = [kind, time.monotonic() + (index % 100) / 100 * self.dribble_every, False]
        self.selector.register(s, selectors.EVENT_READ)
        self.opened += 1

    def run(self):
        index = 0
        while not self.stop.is_set():
            # Top up to `count` (a bounded batch per round, so reads are not starved).
            missing = self.count - (len(self.sockets) if self.reopen else index)
            for _ in range(min(2000, missing)):
                self.open_one(index)
                index += 1
            for key, _ in self.selector.select(timeout=0.05):
                s = key.fileobj
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self.closed_by_server += 1
                    self.drop(s)
            now = time.monotonic()
            for s, state in list(self.sockets.items()):
                kind, due, started = state
                if kind != "dribble" or now < due:
                    continue
                try:
                    s.send(b"X" if started else b"POST /v1/chat/completions HTTP/1.1\r\nX-Slow: ")
                    state[2] = True
                except (BlockingIOError, OSError):
                    pass
                state[1] = now + self.dribble_every
        for s in list(self.sockets):
            self.drop(s)

    def drop(self, s):
        self.selector.unregister(s)
        del self.sockets[s]
        s.close()


def flood_worker(address, count, args, stop, worker, held, results):
    """One client process: opens `count` sockets, and holds them until `stop`;
    `held[worker]` counts those the server has not closed."""
    raise_file_limit(count)
    flood = Flood(address, count, args.dribble_every, args.reopen, stop, worker)
    reporter = threading.Thread(target=lambda: report_held(flood, held, worker, stop), daemon=True)
    reporter.start()
    flood.run()
    results.put((flood.opened, flood.closed_by_server, flood.connect_errors))


def report_held(flood, held, worker, stop):
    while not stop.is_set():
        held[worker] = len(flood.sockets)
        time.sleep(0.2)


def open_files(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def main():
    args = parse_args()
    server, address = start_server(args.server)
    stop, results = multiprocessing.Event(), multiprocessing.Queue()
    held_by = multiprocessing.Array("i", args.processes)
    share = args.connections // args.processes
    workers = [
        multiprocessing.Process(target=flood_worker, args=(address, share, args, stop, w, held_by, results))
        for w in range(args.processes)
    ]
    for w in workers:
        w.start()
    latencies, failures = [], []
    started = time.monotonic()
    full_at, most_held, server_files = None, 0, 0
    while time.monotonic() - started < args.seconds:
        status, seconds = probe(address, 1.0)
        latencies.append(seconds)
        if status != 200 or seconds > 1.0:
            failures.append((round(time.monotonic() - started, 2), status, round(seconds, 3)))
        most_held = max(most_held, sum(held_by))
        server_files = max(server_files, open_files(server.pid))
        if full_at is None and sum(held_by) >= share * args.processes:
            full_at = time.monotonic() - started
        time.sleep(0.1)
    held = sum(held_by)
    server.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    try:
        code = server.wait(timeout=120)
        exit_after = time.monotonic() - signalled
    except subprocess.TimeoutExpired:
        server.kill()
        code, exit_after = None, None
    stop.set()
    opened = closed = errors = 0
    for _ in workers:
        o, c, e = results.get()
        opened, closed, errors = opened + o, closed + c, errors + e
    for w in workers:
        w.join()
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]
    print(f"client sockets open (not closed by the server): at most {most_held}, at the end {held}; all {args.connections} at once from t={full_at and round(full_at, 1)} s")
    print(f"server's open files: at most {server_files}")
    print(f"connections opened: {opened}, closed by the server: {closed}, connect errors: {errors}")
    print(f"/health probes: {len(latencies)}, p50 {pick(0.5) * 1000:.1f} ms, p99 {pick(0.99) * 1000:.1f} ms, max {latencies[-1] * 1000:.1f} ms")
    print(f"probes failed or over 1 s: {len(failures)} {failures[:10]}")
    print(f"SIGTERM: exit status {code} after {exit_after and round(exit_after, 2)} s")
    return 0 if not failures and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
