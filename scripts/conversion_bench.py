#!/usr/bin/env python3
"""Conversion cost: wall time, peak memory and disk of each converter step (issue 46, item 4).

    scripts/conversion_bench.py [--converter target/release/converter] --work DIR SOURCE...

A SOURCE is a checkpoint directory (converted with `convert`) or a .gguf file: both
`import-gguf` then `convert` (the two steps) and `convert FILE.gguf` (one step). Each step is
a fresh process; for each it prints wall seconds, peak RSS (the kernel's VmHWM: anonymous
memory and the file pages the process mapped, which the kernel may drop) and peak anonymous
memory (RssAnon, sampled every 10 ms: what the process itself holds), and the bytes each
result takes on disk. A markdown table, one row a step, goes to stdout; DIR is emptied first
and each result removed after it is measured.
"""

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def status_kb(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return None


def measured(cmd):
    """Runs cmd; returns (seconds, peak RSS bytes, peak anonymous bytes)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    hwm = anon = 0
    while proc.poll() is None:
        hwm = max(hwm, status_kb(proc.pid, "VmHWM") or 0)
        anon = max(anon, status_kb(proc.pid, "RssAnon") or 0)
        time.sleep(0.01)
    seconds = time.monotonic() - start
    stderr = proc.stderr.read()
    if proc.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{stderr}")
    return seconds, hwm * 1024, anon * 1024


def disk(path):
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def gb(n):
    return f"{n / 1e9:.2f} GB"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--converter", default="target/release/converter")
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("sources", nargs="+", type=Path)
    args = p.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    conv = args.converter
    print("| source | step | wall | peak RSS | peak anonymous | on disk after |")
    print("|---|---|---:|---:|---:|---:|")

    def row(source, step, m, on_disk):
        s, hwm, anon = m
        print(f"| {source.name} | {step} | {s:.1f} s | {gb(hwm)} | {gb(anon)} | {gb(on_disk)} |",
              flush=True)

    for source in args.sources:
        hf, two, one = args.work / "hf", args.work / "two", args.work / "one"
        if source.is_dir():
            row(source, "convert", measured([conv, "convert", source, two]), disk(two))
            shutil.rmtree(two)
            continue
        m = measured([conv, "import-gguf", source, hf])
        row(source, "import-gguf", m, disk(hf))
        m = measured([conv, "convert", hf, two])
        row(source, "then convert", m, disk(hf) + disk(two))
        shutil.rmtree(hf)  # room for the third: a 3B checkpoint in f32 is 13 GB
        m = measured([conv, "convert", source, one])
        row(source, "convert .gguf (one step)", m, disk(one))
        for name in sorted(os.listdir(two)):
            if not filecmp.cmp(two / name, one / name, shallow=False):
                sys.exit(f"{source}: {name} differs between the two ways")
        for d in (two, one):
            shutil.rmtree(d)


if __name__ == "__main__":
    main()
