"""The host-RAM floor of every way to play and of the training stages' model setup: the peak resident memory
(process RSS) of each row of :mod:`animegamer.bench.memory` in a fresh process, at full size with random weights,
one row at a time, each under an address-space cap so that a row too big for the machine dies alone.

    python research/memory_floor.py --root /tmp/memory_floor --out benchmarks/cpu     # full size: ~18 GB of disk
    python research/memory_floor.py --root /tmp/mf --out /tmp/mf_out --arch tiny     # the structure, in a minute

First the random weights (``python -m animegamer.bench.memory --write``, once; kept under ``--root``), then every
row of ``--rows``: before each, ``MemAvailable`` must reach ``--min-available-gib`` within ``--wait-s`` (else the
row is recorded as not run), and it runs as ``prlimit --as=<--cap-gib> python -m animegamer.bench.memory ROW``.
While a row runs, its peak RSS so far (``VmHWM``) and peak address space (``VmPeak``) are read from /proc every 0.2
s, so a row that dies (MemoryError, or any crash once the cap is reached) is recorded as "does not fit in N GiB"
with what it had reached. Writes ``<out>/memory_floor.json`` and ``memory_floor.md``, after every row.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from animegamer.bench.memory import ROWS
from animegamer.io import atomic_write_json, atomic_write_text

GIB = 1 << 30


def mem_available() -> int:
    """MemAvailable of /proc/meminfo, in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise OSError("/proc/meminfo has no MemAvailable")


def wait_for_memory(needed: int, wait_s: float, poll_s: float = 5.0) -> int:
    """MemAvailable once it reaches ``needed`` bytes, or what it is after ``wait_s`` seconds of waiting (the
    machine is shared: other jobs' memory comes and goes)."""
    deadline = time.monotonic() + wait_s
    while (available := mem_available()) < needed and time.monotonic() < deadline:
        time.sleep(poll_s)
    return available


STATUS_KEYS = ("VmHWM", "VmPeak", "RssAnon", "RssFile")


def _status(pid: int) -> dict[str, int]:
    """VmHWM / VmPeak / RssAnon / RssFile of a live process, in bytes ({} once it is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in lines) if k in STATUS_KEYS}


def run_capped(args: list[str], cap_bytes: int, poll_s: float = 0.2) -> dict:
    """``prlimit --as=cap python -m animegamer.bench.memory *args``: its return code, last JSON line, stderr tail
    and the highest VmHWM / VmPeak / RssAnon (memory only RAM can hold) / RssFile (pages of mapped files, which
    the kernel can drop and read again) seen while it ran."""
    command = ["prlimit", f"--as={cap_bytes}", sys.executable, "-m", "animegamer.bench.memory", *args]
    seen = dict.fromkeys(STATUS_KEYS, 0)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        while child.poll() is None:
            for key, value in _status(child.pid).items():
                seen[key] = max(seen[key], value)
            time.sleep(poll_s)
        out, err = child.communicate()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return {"returncode": child.returncode, "result": json.loads(lines[-1]) if lines else None,
            "stderr_tail": err.strip().splitlines()[-3:], "polled_peak_rss_bytes": seen["VmHWM"],
            "polled_peak_address_space_bytes": seen["VmPeak"], "polled_peak_anon_rss_bytes": seen["RssAnon"],
            "polled_peak_file_rss_bytes": seen["RssFile"]}


def row_entry(name: str, run: dict, cap_gib: float) -> dict:
    """One table row from a capped run: measured, or 'does not fit' with what it reached."""
    result = run["result"]
    polled = {k: v for k, v in run.items() if k.startswith("polled_")}
    if run["returncode"] == 0 and result:
        return {**result, "fits": True, **polled}
    return {"row": name, "what": ROWS[name][0], "fits": False, "returncode": run["returncode"],
            "note": f"does not fit in {cap_gib:g} GiB of address space",
            "peak_rss_bytes_reached": run["polled_peak_rss_bytes"], **polled, "stderr_tail": run["stderr_tail"]}


def markdown(report: dict) -> str:
    """The table of a report: one line per row, peak RSS in GiB (or why it has none)."""
    lines = [f"# Host RAM floor ({report['arch']} size, random weights)", "",
             f"{report['date']}, {report['device']}, torch {report['torch']}; "
             f"{'; '.join(f'`{c}`' for c in report.get('commands', [report['command']]))}; each row in a "
             f"fresh process under `prlimit --as` (its cap in GiB of address space per row).", "",
             "| row | what | peak RSS (GiB) | of it anonymous / file pages, polled (GiB) | RSS after imports (GiB) "
             "| seconds | cap |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for row in report["rows"].values():
        split = (f"{row.get('polled_peak_anon_rss_bytes', 0) / GIB:.2f} / "
                 f"{row.get('polled_peak_file_rss_bytes', 0) / GIB:.2f}")
        if row.get("fits"):
            cells = (f"{row['peak_rss_bytes'] / GIB:.2f}", split, f"{row['baseline_rss_bytes'] / GIB:.2f}",
                     f"{row['seconds']}")
        elif "note" in row:
            reached = row.get("peak_rss_bytes_reached", 0) / GIB
            cells = (f"{row['note']} (reached {reached:.2f})", split, "", "")
        else:
            cells = (row.get("skipped", ""), "", "", "")
        cap = row.get("cap_gib", report["cap_gib"])
        lines.append(f"| {row['row']} | {row['what']} | {' | '.join(cells)} | {cap:g} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True, help="where the random weights are written (kept for reruns)")
    parser.add_argument("--out", required=True, help="folder for memory_floor.json / .md")
    parser.add_argument("--arch", default="full", choices=("full", "tiny"), help="sizes of the random weights")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated rows of {list(ROWS)}")
    parser.add_argument("--cap-gib", type=float, default=20.0, help="address-space cap of each row (prlimit --as)")
    parser.add_argument("--min-available-gib", type=float, default=18.0,
                        help="MemAvailable needed before each row (else it is recorded as not run)")
    parser.add_argument("--wait-s", type=float, default=600.0,
                        help="how long to wait for --min-available-gib before a row is recorded as not run")
    args = parser.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in rows if r not in ROWS]
    if unknown or not rows:
        parser.exit(2, f"error: unknown rows {unknown}; rows are {list(ROWS)}\n")
    if args.cap_gib <= 0 or args.min_available_gib < 0:
        parser.exit(2, "error: --cap-gib must be > 0 and --min-available-gib >= 0\n")
    out, root = Path(args.out), Path(args.root)
    cap = int(args.cap_gib * GIB)
    report = {"arch": args.arch, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
              "device": f"CPU ({platform.machine()}), {torch.get_num_threads()} threads",
              "command": "python research/memory_floor.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "cap_gib": args.cap_gib, "min_available_gib": args.min_available_gib, "rows": {}}
    path = out / "memory_floor.json"
    if path.is_file():  # rows of an earlier call are kept unless measured again, and its commands listed
        earlier = json.loads(path.read_text())
        report["rows"], report["commands"] = earlier.get("rows", {}), earlier.get("commands", [])
    report["commands"] = [*report.get("commands", []), report["command"]]

    def save() -> None:
        atomic_write_json(path, report)
        atomic_write_text(out / "memory_floor.md", markdown(report))

    needed = int(args.min_available_gib * GIB)
    if not (root / "stage_e" / "small_decoder" / "config.json").is_file():
        if wait_for_memory(needed, args.wait_s) < needed:
            parser.exit(2, f"error: {mem_available() / GIB:.1f} GiB available, --min-available-gib is "
                           f"{args.min_available_gib:g}: not writing the weights now\n")
        written = run_capped(["--write", "--root", str(root), "--arch", args.arch], cap)
        if written["returncode"] != 0:
            parser.exit(2, f"error: writing the random weights failed: {' '.join(written['stderr_tail'])}\n")
        report["weights"] = written["result"]
    for name in rows:
        available = wait_for_memory(needed, args.wait_s)
        if available < needed:
            report["rows"][name] = {"row": name, "what": ROWS[name][0], "fits": None,
                                    "skipped": f"not run: {available / GIB:.1f} GiB available"}
        else:
            print(f"row {name} ({available / GIB:.1f} GiB available)", file=sys.stderr, flush=True)
            entry = row_entry(name, run_capped([name, "--root", str(root)], cap), args.cap_gib)
            report["rows"][name] = {**entry, "available_before_bytes": available, "cap_gib": args.cap_gib}
        save()
    return report


if __name__ == "__main__":
    main()
