"""The torch.compile probe leads its own process group: a timeout, a finished child's leftovers
and a SIGTERM to the verifier each leave no process of that group behind (read from /proc).

The child here is not torch.compile but a stand-in that starts a grandchild which sleeps, as
Inductor's C++ compiler or a worker pool would (CompileProbe's ``argv`` seam;
``TorchMachine.compile_probe`` hands it to the checks)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w
from test_verify_fakes import FakeSystem, by_check, content_hash, make_lock

from envspec.verify.checks import run_checks
from envspec.verify.torchprobe import CompileProbe

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"

# argv[1]: a file to write "<child pid> <grandchild pid>" to; argv[2]: "hang" or "exit"
CHILD = r"""
import json, os, subprocess, sys, time
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
tmp = sys.argv[1] + ".tmp"
with open(tmp, "w") as f:
    f.write(f"{os.getpid()} {g.pid}")
os.rename(tmp, sys.argv[1])
if sys.argv[2] == "exit":
    print(json.dumps({"ok": True, "device": "cpu", "seconds": 0.1, "error": ""}))
    sys.exit(0)
time.sleep(600)
"""


def child_argv(pidfile: Path, how: str) -> list[str]:
    return [sys.executable, "-c", CHILD, str(pidfile), how]


def wait_for(pidfile: Path, limit: float = 120) -> tuple[int, int]:
    deadline = time.monotonic() + limit
    while not pidfile.exists():
        assert time.monotonic() < deadline, "the stand-in child never started its grandchild"
        time.sleep(0.05)
    child, grandchild = (int(x) for x in pidfile.read_text().split())
    return child, grandchild


def live_in_group(pgid: int) -> list[str]:
    """Processes whose process group is ``pgid`` and that are not zombies, from /proc/PID/stat."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(f"{d.name} {stat[:60]!r}")
    return out


def assert_group_gone(pgid: int) -> None:
    # SIGKILL is delivered asynchronously: allow the kernel a moment, then nothing may remain
    deadline = time.monotonic() + 30
    while live_in_group(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_in_group(pgid) == []


def test_the_probe_leads_its_own_group(tmp_path):
    probe = CompileProbe(60, argv=child_argv(tmp_path / "pids", "hang"))
    try:
        child, grandchild = wait_for(tmp_path / "pids")
        assert child == probe.pgid == os.getpgid(grandchild) != os.getpgrp()
    finally:
        probe.close()
    assert_group_gone(probe.pgid)


def test_a_timeout_kills_the_whole_group(tmp_path):
    probe = CompileProbe(1, argv=child_argv(tmp_path / "pids", "hang"))
    child, grandchild = wait_for(tmp_path / "pids")
    assert live_in_group(probe.pgid)  # child and grandchild run
    res = probe.result()
    assert res["timeout"] and not res["ok"]
    assert_group_gone(probe.pgid)
    assert probe.proc.returncode == -signal.SIGKILL


def test_a_finished_childs_leftovers_are_killed(tmp_path):
    probe = CompileProbe(120, argv=child_argv(tmp_path / "pids", "exit"))
    res = probe.result()
    assert res["ok"], res
    wait_for(tmp_path / "pids", limit=1)
    assert_group_gone(probe.pgid)


class ProbeSystem(FakeSystem):
    def __init__(self, pidfile: Path, how: str, **kw) -> None:
        super().__init__(**kw)
        self.pidfile, self.how = pidfile, how

    def compile_probe(self, timeout):
        self.probe = CompileProbe(timeout, argv=child_argv(self.pidfile, self.how))
        return self.probe


def test_full_level_timeout_is_a_warning_and_leaves_nothing(tmp_path):
    system = ProbeSystem(tmp_path / "pids", "hang", driver=None, nodes=())
    r = run_checks(make_lock(), level="full", system=system, skip=("integrity",), compile_timeout=1)
    f = by_check(r)["torch.compile"]
    assert f.status == "warn" and "did not finish within 1 s" in f.observed
    assert_group_gone(system.probe.pgid)


def test_quick_level_starts_no_compile_child(tmp_path):
    system = ProbeSystem(tmp_path / "pids", "hang", driver=None, nodes=())
    r = run_checks(make_lock(), level="quick", system=system, skip=("integrity",))
    f = by_check(r)
    assert not hasattr(system, "probe")
    assert f["torch.compile"].status == "skip" and "--level full" in f["torch.compile"].hint
    assert "torch.compile.toolchain" in f


VERIFIER = r"""
import sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from envspec.verify import cli
from test_verify_compile_probe import ProbeSystem
from pathlib import Path
system = ProbeSystem(Path(sys.argv[3]), "hang", driver=None, nodes=())
sys.exit(cli.main(["--lock", sys.argv[4], "--level", "full", "--compile-timeout", "600", "--skip", "integrity"],
                  system=system))
"""


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")
def test_sigterm_to_the_verifier_kills_the_probes_group(tmp_path):
    lock = make_lock()
    lock.pop("__path__")
    lock["meta"]["content_hash"] = content_hash(lock)
    (tmp_path / "test.lock").write_text(tomli_w.dumps(lock))
    verifier = subprocess.Popen(
        [
            sys.executable,
            "-c",
            VERIFIER,
            str(SRC),
            str(HERE),
            str(tmp_path / "pids"),
            str(tmp_path / "test.lock"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        child, grandchild = wait_for(tmp_path / "pids")
        assert os.getpgid(grandchild) == child != os.getpgid(verifier.pid)
        verifier.send_signal(signal.SIGTERM)
        out, err = verifier.communicate(timeout=120)
    finally:
        if verifier.poll() is None:
            verifier.kill()
    assert verifier.returncode == 128 + signal.SIGTERM, out + err
    assert_group_gone(child)


def test_compile_probe_result_parses_the_childs_json(tmp_path):
    script = "import json; print('noise'); print(json.dumps({'ok': False, 'error': 'boom', 'device': 'cpu'}))"
    res = CompileProbe(120, argv=[sys.executable, "-c", script]).result()
    assert res == {"ok": False, "error": "boom", "device": "cpu"}
    res = CompileProbe(
        120, argv=[sys.executable, "-c", "import sys; sys.stderr.write('bad'); sys.exit(3)"]
    ).result()
    assert not res["ok"] and "child exited 3: bad" in res["error"]
    assert json.dumps(res)
    script = 'print(\'{"ok": "yes", "error": 5, "seconds": 2, "device": "cuda"}\')'
    res = CompileProbe(120, argv=[sys.executable, "-c", script]).result()
    assert res == {"ok": False, "device": "cuda", "seconds": 2.0}  # only what has its type
