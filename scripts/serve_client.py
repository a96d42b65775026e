"""What the serving scripts share: a `runtime serve` started on a free port and waited for,
and a JSON POST to it (the server takes `application/json` bodies only)."""
import json
import subprocess
import time
import urllib.request


def start(binary, artifacts, *options):
    """Starts `binary serve` with `options`; returns the process and its base URL once
    `/health` answers."""
    process = subprocess.Popen([binary, "serve", "--port", "0", "--artifacts", artifacts, *options],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    base = process.stdout.readline().strip().removeprefix("listening on ")
    while True:
        try:
            urllib.request.urlopen(base + "/health")
            return process, base
        except Exception:
            time.sleep(0.05)


def post(base, body, path="/v1/chat/completions", timeout=900):
    """POSTs `body` as JSON; the open response."""
    request = urllib.request.Request(base + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=timeout)


def rss_mb(process):
    """The process's resident memory, in MB."""
    for line in open(f"/proc/{process.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
