#!/usr/bin/env bash
# Compare builds of the `actorcile` binary (or one build's two runtimes) side by side: runs each
# variant's bench child alternately N times, so machine noise falls on all of them alike, and
# prints per variant the median and fastest seconds, the median CPU time of the measured window
# (`cpu_seconds`), median user/system CPU of the whole child, and peak RSS.
#
#   scripts/bench-variants.sh N WORKLOAD "LABEL=BINARY:RUNTIME ..." [extra bench args]
#
# e.g. compare the build of an older commit with the current one and kube-runtime:
#   cp target/release/actorcile /tmp/actorcile-old        # built at the older commit
#   cargo build --release
#   scripts/bench-variants.sh 7 noop "old=/tmp/actorcile-old:actorcile \
#       new=target/release/actorcile:actorcile kube=target/release/actorcile:kube-runtime"
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,12p "$0"; exit 2; }
N=$1 W=$2 V=$3
shift 3
for _ in $(seq "$N"); do
  for v in $V; do
    label=${v%%=*} rest=${v#*=}
    bin=${rest%%:*} rt=${rest#*:}
    /usr/bin/time -f "TIME %U %S" "$bin" bench --child "$rt" --workload "$W" --runtimes "$rt" --json "$@" 2>&1 |
      python3 -c '
import json, sys
label = sys.argv[1]
secs = cpu = user = sys_t = rss = None
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        d = json.loads(line)
        secs, cpu, rss = d["seconds"], d.get("cpu_seconds", 0.0), d["peak_rss_bytes"] >> 20
    elif line.startswith("TIME"):
        _, user, sys_t = line.split()
print(label, secs, cpu, user, sys_t, rss)
' "$label"
  done
done | python3 -c '
import statistics as st, sys
runs = {}
for line in sys.stdin:
    label, s, c, u, k, r = line.split()
    runs.setdefault(label, []).append((float(s), float(c), float(u), float(k), int(r)))
for label, v in runs.items():
    print("%-8s secs med %.3f min %.3f  window CPU %.3f  user %.2f sys %.2f  rss %d MiB  all: %s" % (
        label, st.median(x[0] for x in v), min(x[0] for x in v), st.median(x[1] for x in v),
        st.median(x[2] for x in v), st.median(x[3] for x in v), st.median(x[4] for x in v),
        " ".join("%.3f" % x[0] for x in v)))
'
