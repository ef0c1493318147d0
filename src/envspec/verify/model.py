"""Findings and the report: the verifier's only output shapes.

A ``Finding`` is one fact about the machine set against what the lock expects. A ``Report`` is
the findings of one run plus what identifies the run (lock hash, level, fingerprint, timings).
The JSON form is documented in docs/verify.md (``schema`` = 1; fields are only ever added).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Final, Literal, TypedDict

Status = Literal["pass", "warn", "fail", "skip"]
PASS: Final = "pass"
WARN: Final = "warn"
FAIL: Final = "fail"
SKIP: Final = "skip"
STATUSES: tuple[Status, ...] = (PASS, WARN, FAIL, SKIP)

SCHEMA_VERSION = 1


@dataclass
class Finding:
    """One check's result: what the lock expects, what the machine shows, and what to do."""

    check: str  # dotted, stable name, e.g. "gpu.0.arch", "torch.nccl", "integrity.files"
    status: Status
    expected: str = ""
    observed: str = ""
    hint: str = ""
    data: dict[str, object] = field(default_factory=dict)  # JSON-able numbers and lists, for
    # JSON and Prometheus consumers (render.py reads them)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        if not d["data"]:
            del d["data"]
        return d


class NodeEntry(TypedDict):
    """One rank of a multi-node run (``multinode``): where it runs, its fingerprint, its verdict
    and the checks it failed."""

    failed: list[str]
    fingerprint: dict[str, str]
    local_rank: int
    node_rank: int
    ok: bool
    rank: int
    test_hook: bool


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    level: str = "quick"
    lock_path: str = ""
    lock_hash: str = ""
    lock_name: str = ""
    mode: str = "image"  # "image": running in the lock's venv; "host": any other python
    fingerprint: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per check group
    strict: bool = False
    nodes: list[NodeEntry] = field(default_factory=list)  # multi-node: one entry a rank

    def add(self, finding: Finding) -> Finding:
        self.findings.append(finding)
        return finding

    def extend(self, findings: list[Finding]) -> None:
        self.findings.extend(findings)

    def counts(self) -> dict[str, int]:
        c: dict[str, int] = {s: 0 for s in STATUSES}
        for f in self.findings:
            c[f.status] += 1
        return c

    @property
    def ok(self) -> bool:
        bad = {FAIL, WARN} if self.strict else {FAIL}
        return not any(f.status in bad for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, object]:
        return {
            "schema": SCHEMA_VERSION,
            "ok": self.ok,
            "strict": self.strict,
            "level": self.level,
            "mode": self.mode,
            "lock": {"path": self.lock_path, "name": self.lock_name, "hash": self.lock_hash},
            "counts": self.counts(),
            "fingerprint": dict(sorted(self.fingerprint.items())),
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "findings": [f.to_dict() for f in self.findings],
            **({"nodes": self.nodes} if self.nodes else {}),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False) + "\n"
