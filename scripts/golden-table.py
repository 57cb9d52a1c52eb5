#!/usr/bin/env python3
"""Compares two folders written by scripts/golden-runs.sh (the tree before a change and after it)
and prints a Markdown table: per preset, whether the synthetic file's sha256 and each bmoe-cli
run's output are byte-identical. Exits 1 if anything differs or is missing on one side.

  scripts/golden-table.py BEFORE_DIR AFTER_DIR
"""

import os
import sys


def outputs(folder):
    """{preset: {run: bytes}} from golden-runs.sh's files: <preset>.<run>.json, <preset>.synth.sha256."""
    found = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".synth.sha256"):
            preset, run = name[: -len(".synth.sha256")], "synth"
        elif name.endswith(".json"):
            preset, run = name[: -len(".json")].rsplit(".", 1)
        else:
            continue
        with open(os.path.join(folder, name), "rb") as f:
            found.setdefault(preset, {})[run] = f.read()
    return found


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip())
    before, after = outputs(sys.argv[1]), outputs(sys.argv[2])
    runs = sorted({r for p in list(before.values()) + list(after.values()) for r in p},
                  key=lambda r: (r != "synth", r))
    print("| preset | " + " | ".join(runs) + " |")
    print("|---" * (len(runs) + 1) + "|")
    differing = 0
    for preset in sorted(set(before) | set(after)):
        cells = []
        for run in runs:
            a, b = before.get(preset, {}).get(run), after.get(preset, {}).get(run)
            if a is None or b is None:
                cells.append("missing")
                differing += 1
            elif a != b:
                cells.append("DIFF")
                differing += 1
            else:
                cells.append("err=" if a.startswith(b"exit ") else "same")
        print(f"| {preset} | " + " | ".join(cells) + " |")
    total = sum(len(p) for p in before.values())
    print(f"\n{total} outputs compared, {differing} differ or are missing"
          " (same: byte-identical; err=: the same one-line failure on both sides)")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
