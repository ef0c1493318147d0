"""Turn bench/verify_h200.py's results.json into the markdown of docs/verify-h200.md.

python3 bench/verify_h200_summary.py results.json > summary.md
"""

from __future__ import annotations

import json
import sys


def esc(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def main(path: str) -> int:
    res = json.load(open(path))
    out = [
        "| run | command | exit | wall s | verify total s | torch import s | total minus import s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in res.items():
        rep = r.get("report") or {}
        t = rep.get("timings", {})
        tot, imp = t.get("total"), t.get("torch.import")
        rest = f"{tot - imp:.1f}" if tot is not None and imp is not None else ""
        out.append(
            f"| {name} | `{esc(r['cmd'])}` | {esc(r['rc'])} | {r['wall_s']:.1f} | "
            f"{'' if tot is None else f'{tot:.1f}'} | {'' if imp is None else f'{imp:.1f}'} | {rest} |"
        )
    out.append("")
    for name, r in res.items():
        rep = r.get("report")
        if not rep:
            continue
        c = rep["counts"]
        out += [
            f"### {name}",
            "",
            f"`{esc(r['cmd'])}` -> exit {r['rc']}, ok={rep['ok']}, "
            f"{c['pass']} pass, {c['warn']} warn, {c['fail']} fail, {c['skip']} skip",
            "",
            "| status | check | expected | observed |",
            "| --- | --- | --- | --- |",
        ]
        for f in rep["findings"]:
            out.append(
                f"| {f['status']} | {f['check']} | {esc(f['expected'])} | {esc(f['observed'])} |"
            )
        hints = [f for f in rep["findings"] if f["status"] in ("warn", "fail") and f["hint"]]
        if hints:
            out += ["", "Hints:", ""] + [f"- `{f['check']}`: {esc(f['hint'])}" for f in hints]
        out.append("")
    gemm = [
        "| run | GPU | kind | TFLOP/s | datasheet | fraction | status |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    ar = ["| run | bytes | time us | algbw GB/s | busbw GB/s |", "| --- | --- | --- | --- | --- |"]
    for name, r in res.items():
        for f in (r.get("report") or {}).get("findings", []):
            d = f.get("data", {})
            if f["check"].startswith("perf.") and "tflops" in d:
                _, gpu, kind = f["check"].split(".")
                gemm.append(
                    f"| {name} | {gpu} | {kind} | {d['tflops']:.0f} | {d.get('expected_tflops', '')} | "
                    f"{d.get('fraction', 0):.0%} | {f['status']} |"
                )
                if "fp32_tflops" in d:
                    gemm.append(
                        f"| {name} | {gpu} | fp32 (TF32 off) | {d['fp32_tflops']:.0f} | | | |"
                    )
            if f["check"].endswith("allreduce") and d.get("sizes"):
                for s in d["sizes"]:
                    ar.append(
                        f"| {name} | {s['bytes']} | {s['time_us']:.0f} | {s['algbw_gbps']:.1f} | "
                        f"{s['busbw_gbps']:.1f} |"
                    )
    out += ["### GEMM", ""] + gemm + ["", "### All-reduce", ""] + ar + [""]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
