#!/usr/bin/env python3
"""Run a command and measure the disk a directory takes while it runs.

    peak_disk.py DIR -- CMD...

Polls DIR every 5 ms (the allocated blocks of every file under it, symbolic links not
followed) while CMD runs, and prints one JSON line: the peak and final bytes, CMD's exit
status and the number of samples. Exits with CMD's status."""
import json
import os
import subprocess
import sys
import time


def usage(d):
    total = 0
    for root, dirs, files in os.walk(d):
        for n in files + dirs:
            try:
                st = os.lstat(os.path.join(root, n))
            except FileNotFoundError:            # a temporary renamed or removed meanwhile
                continue
            total += st.st_blocks * 512
    return total


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit("usage: peak_disk.py DIR -- CMD...")
    d, cmd = sys.argv[1], sys.argv[3:]
    p = subprocess.Popen(cmd)
    peak, n = 0, 0
    while p.poll() is None:
        if os.path.isdir(d):
            peak = max(peak, usage(d))
        n += 1
        time.sleep(0.005)
    final = usage(d) if os.path.isdir(d) else 0
    print(json.dumps({"peak_bytes": max(peak, final), "final_bytes": final, "exit": p.returncode, "samples": n}))
    sys.exit(p.returncode)


if __name__ == "__main__":
    main()
