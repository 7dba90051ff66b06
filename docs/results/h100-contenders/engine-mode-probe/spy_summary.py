"""Probe helper (kept in docs/results as it ran): py-spy raw output -> per process/thread, top leaf and inclusive frames."""

import re
import sys
from collections import Counter, defaultdict

leaf = defaultdict(Counter)
incl = defaultdict(Counter)
total = Counter()
text = open(sys.argv[1], errors="replace").read()
for match in re.finditer(r'(process \d+:".*?");(thread \(\d+\)[^;]*);(.*?) (\d+)$', text, re.S | re.M):
    procs, thread, stack, count = match.groups()
    pid, cmd = re.findall(r'process (\d+):"(.*?)"(?:;|$)', procs, re.S)[-1]
    key = f"{pid} {cmd[:50]!r} {thread}"
    frames = stack.split(";")
    n = int(count)
    total[key] += n
    leaf[key][frames[-1][:110]] += n
    for frame in set(f.split(" (")[0] for f in frames):
        incl[key][frame] += n
for key, n in total.most_common(14):
    print(f"\n== {key}: {n} samples")
    for frame, c in leaf[key].most_common(7):
        print(f"   leaf {c / n:6.1%} {frame}")
    print("   incl " + ", ".join(f"{f} {c / n:.0%}" for f, c in incl[key].most_common(40)
                                if c / n < 0.995 and c / n > 0.03)[:1500])
