"""Compare what bench/verify_ab.sh left: the old and new verifier's reports check by check (the
same checks in the same order, each one's status, its expected, observed and hint with every
number masked, its data's keys), the start-up hook's output and NVML's recorded answers.

    python3 bench/verify_ab_compare.py RESULTS_DIR
"""

import json
import pathlib
import re
import sys


def _health(path: pathlib.Path) -> object:
    """``health --record``'s JSON; its message as it is where it recorded nothing (no NVML)."""
    text = path.read_text()
    try:
        return json.loads(text)
    except ValueError:
        return text


d = pathlib.Path(sys.argv[1])
num = re.compile(r"\d+(\.\d+)?")
for name in ("quick", "full", "wrong"):
    for rnd in (1, 2):
        a = json.loads((d / f"old-{name}-{rnd}.json").read_text())
        b = json.loads((d / f"new-{name}-{rnd}.json").read_text())
        fa = {f["check"]: f for f in a["findings"]}
        fb = {f["check"]: f for f in b["findings"]}
        diffs = []
        if list(fa) != list(fb):
            diffs.append(
                f"checks differ: only old {sorted(set(fa) - set(fb))}, only new {sorted(set(fb) - set(fa))}"
            )
        for c in fa:
            if c not in fb:
                continue
            x, y = fa[c], fb[c]
            if x["status"] != y["status"]:
                diffs.append(f"{c}: status {x['status']} -> {y['status']}")
            for k in ("expected", "observed", "hint"):
                if num.sub("#", x.get(k, "")) != num.sub("#", y.get(k, "")):
                    diffs.append(f"{c}.{k}: {x.get(k)!r} -> {y.get(k)!r}")
            if sorted(x.get("data", {})) != sorted(y.get("data", {})):
                diffs.append(
                    f"{c}.data keys {sorted(x.get('data', {}))} -> {sorted(y.get('data', {}))}"
                )
        print(
            f"{name} round {rnd}: {len(fa)} checks old, {len(fb)} new; counts old {a['counts']} new {b['counts']}; {len(diffs)} differences"
        )
        for line in diffs[:30]:
            print("   ", line)
for rnd in (1, 2):
    a = (d / f"old-startup-{rnd}.txt").read_text()
    b = (d / f"new-startup-{rnd}.txt").read_text()
    print(f"startup round {rnd}: {'same' if num.sub('#', a) == num.sub('#', b) else 'DIFFERS'}")
    ha, hb = (_health(d / f"{side}-health-{rnd}.json") for side in ("old", "new"))
    print(f"health --record round {rnd}: {'same' if ha == hb else 'DIFFERS'}")
