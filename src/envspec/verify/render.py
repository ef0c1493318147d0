"""Report -> text: the human table, Prometheus textfile metrics. Standard library only (rich is
not in images)."""

from __future__ import annotations

import os
import tempfile
import textwrap
import time
from pathlib import Path

from .model import FAIL, PASS, SKIP, WARN, Report

_MARK = {PASS: "PASS", WARN: "WARN", FAIL: "FAIL", SKIP: "skip"}


def table(report: Report, width: int = 120, verbose: bool = False) -> str:
    lines = []
    lock = report.lock_name or report.lock_path or "(lock)"
    lines.append(
        f"envspec verify: {lock} {report.lock_hash[:19]}  level={report.level} mode={report.mode}"
    )
    cw = max([len(f.check) for f in report.findings] + [5])
    cw = min(cw, 34)
    rest = max(40, width - cw - 8)
    ew = rest * 2 // 5
    ow = rest - ew
    lines.append(f"{'STATUS':6}  {'CHECK':{cw}}  {'EXPECTED':{ew}}  OBSERVED")
    for f in report.findings:
        exp = textwrap.wrap(f.expected, ew) or [""]
        obs = textwrap.wrap(f.observed, ow) or [""]
        for k in range(max(len(exp), len(obs))):
            lines.append(
                f"{_MARK[f.status] if k == 0 else '':6}  {f.check if k == 0 else '':{cw}}  "
                f"{exp[k] if k < len(exp) else '':{ew}}  {obs[k] if k < len(obs) else ''}".rstrip()
            )
        if f.hint and (f.status in (WARN, FAIL) or verbose):
            for h in textwrap.wrap("hint: " + f.hint, width - 10):
                lines.append(" " * 8 + h)
        tb = f.data.get("traceback")
        if verbose and isinstance(tb, str) and tb:
            lines.extend(" " * 8 + t for t in tb.rstrip().splitlines())
    c = report.counts()
    verdict = "OK" if report.ok else "FAILED"
    total = report.timings.get("total")
    lines.append(
        f"{verdict}: {c[PASS]} pass, {c[WARN]} warn, {c[FAIL]} fail, {c[SKIP]} skip"
        + (" (--strict: warnings fail)" if report.strict else "")
        + (f" in {total:.1f} s" if total is not None else "")
    )
    return "\n".join(lines) + "\n"


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prometheus(report: Report, now: float | None = None) -> str:
    """Node-exporter textfile-collector format: one gauge family a kind of number."""
    lock = _label(report.lock_name)
    h = _label(report.lock_hash)
    base = f'lock="{lock}",lock_hash="{h}",level="{report.level}"'
    out: list[str] = []

    def fam(name: str, help_: str) -> None:
        out.extend(_family(name, help_))

    fam(
        "envspec_verify_ok",
        "1 when the last verification found no failure (no warning with --strict)",
    )
    out.append(f"envspec_verify_ok{{{base}}} {int(report.ok)}")
    fam("envspec_verify_last_run_timestamp_seconds", "when the last verification finished")
    out.append(
        f"envspec_verify_last_run_timestamp_seconds{{{base}}} {now if now is not None else time.time():.0f}"
    )
    fam("envspec_verify_duration_seconds", "how long the last verification took")
    out.append(f"envspec_verify_duration_seconds{{{base}}} {report.timings.get('total', 0.0):.3f}")
    fam("envspec_verify_findings", "number of findings by status")
    for s, n in report.counts().items():
        out.append(f'envspec_verify_findings{{{base},status="{s}"}} {n}')
    fam("envspec_verify_check", "findings per check and status (1 for most; a series appears once)")
    per_check: dict[tuple[str, str], int] = {}
    for f in report.findings:  # a label set may appear only once in a scrape
        per_check[(f.check, f.status)] = per_check.get((f.check, f.status), 0) + 1
    for (check, status), n in per_check.items():
        out.append(f'envspec_verify_check{{{base},check="{_label(check)}",status="{status}"}} {n}')
    out += _perf_gauges(report, base)
    out += _health_gauges(report, base)
    xid = [f for f in report.findings if f.check == "health.xid" and "events" in f.data]
    if xid:
        fam("envspec_verify_xid_events", "XID events in the kernel log since boot")
        out.append(f"envspec_verify_xid_events{{{base}}} {_int(xid[0].data['events'])}")
    ar = [f for f in report.findings if f.check.endswith("allreduce") and f.data.get("sizes")]
    if ar:
        fam("envspec_verify_allreduce_busbw_gbps", "NCCL all-reduce bus bandwidth by message size")
        for f in ar:
            scope = "cluster" if "cluster" in f.check else "node"
            sizes = f.data["sizes"]
            for s in sizes if isinstance(sizes, list) else []:
                out.append(
                    f'envspec_verify_allreduce_busbw_gbps{{{base},scope="{scope}",bytes="{s["bytes"]}"}} '
                    f"{s['busbw_gbps']:.2f}"
                )
    return "\n".join(out) + "\n"


def _int(v: object) -> int:
    """A finding's number (its data, as the check wrote it) as a gauge's integer."""
    return int(v) if isinstance(v, int | float | str) else 0


def _family(name: str, help_: str) -> list[str]:
    return [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]


def _perf_gauges(report: Report, base: str) -> list[str]:
    """The GEMM rates and the host<->GPU copy rates, per GPU."""
    out: list[str] = []

    def fam(name: str, help_: str) -> None:
        out.extend(_family(name, help_))

    gemm = [f for f in report.findings if f.check.startswith("perf.") and "tflops" in f.data]
    if gemm:
        fam("envspec_verify_gemm_tflops", "measured dense GEMM rate (8192^3) per GPU and kind")
        for f in gemm:
            _, gpu, kind = f.check.split(".", 2)
            out.append(
                f'envspec_verify_gemm_tflops{{{base},gpu="{gpu}",kind="{kind}"}} {f.data["tflops"]:.1f}'
            )
    copies = [f for f in report.findings if f.check.startswith("perf.") and "gbps" in f.data]
    if copies:
        fam(
            "envspec_verify_copy_gbps",
            "measured host<->GPU copy bandwidth per GPU and direction (h2d, d2h)",
        )
        for f in copies:
            _, gpu, way = f.check.split(".", 2)
            out.append(
                f'envspec_verify_copy_gbps{{{base},gpu="{gpu}",direction="{way}"}} {f.data["gbps"]:.2f}'
            )
    return out


def _health_gauges(report: Report, base: str) -> list[str]:
    """Each GPU's health numbers: uncorrected ECC, pending row remaps, throttle reasons, NVLinks."""
    out: list[str] = []
    numbers = (
        (
            "ecc",
            "uncorrected",
            "envspec_verify_gpu_ecc_uncorrected",
            "uncorrected ECC errors since the driver loaded, per GPU",
        ),
        (
            "row_remap",
            "pending",
            "envspec_verify_gpu_row_remap_pending",
            "1 when a row remap waits for a GPU reset",
        ),
        (
            "throttle",
            "reasons",
            "envspec_verify_gpu_clocks_event_reasons",
            "NVML's active clocks event (throttle) reasons, a bit mask",
        ),
        ("nvlink", "up", "envspec_verify_gpu_nvlinks_up", "NVLinks up per GPU"),
    )
    for suffix, key, name, help_ in numbers:
        rows = [
            f
            for f in report.findings
            if f.check.startswith("health.gpu.")
            and f.check.endswith("." + suffix)
            and key in f.data
        ]
        if rows:
            out.extend(_family(name, help_))
            for f in rows:
                out.append(f'{name}{{{base},gpu="{f.check.split(".")[2]}"}} {_int(f.data[key])}')
    return out


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write next to the target and rename, so the collector never reads half a file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
