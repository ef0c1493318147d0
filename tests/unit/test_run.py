"""envspec run: the argv for docker and podman hosts as golden files, from fake ``Host``s.

Regenerate the golden outputs (then review them like code):
    ENVSPEC_REGEN_GOLDEN=1 python -m pytest tests/unit/test_run.py
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from envspec.errors import HostError, UsageError
from envspec.host import Host, Tool, bridge_conflict, detect_host
from envspec.lock import Jupyter, Lockfile, Services, Ssh, load
from envspec.run import (
    Runnable,
    RunOptions,
    plan_run,
    podman_args,
    resolve_runnable,
    run_lines,
    start_lines,
)

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
REGEN = os.environ.get("ENVSPEC_REGEN_GOLDEN") == "1"


def _lock() -> Lockfile:
    """The golden diff's new lock, with Jupyter and SSH enabled (a GPU lock: cu130)."""
    lk = load(GOLDEN / "diff" / "new.lock")
    return lk.model_copy(
        update={
            "services": Services(
                jupyter=Jupyter(enabled=True, port=8888),
                ssh=Ssh(enabled=True, port=2222, authorized_keys=""),
            )
        }
    )


def _tools(*names: str) -> dict[str, Tool]:
    return {n: Tool(f"/usr/bin/{n}") for n in names}


# This project's Debian 12 machines: rootful podman, hybrid cgroups, no crun, no systemd, no
# CAP_SYS_RESOURCE, nofile hard limit 20000, no GPU.
DEBIAN_HYBRID = Host(
    tools=_tools("podman", "runc", "slirp4netns"),
    cgroup="hybrid",
    systemd=False,
    euid=0,
    cap_sys_resource=False,
    rlimits={
        "nofile": (20000, 20000),
        "nproc": (96365, 96365),
        "memlock": (8388608, 8388608),
        "stack": (-1, -1),
    },
    cwd="/srv/project",
    cwd_uid=1000,
    podman_init=False,
    host_init="/usr/bin/tini",
    pid_max=32768,
    bridge_conflict="cni-podman0",
)
# A GPU workstation: rootless podman on cgroup v2 with a CDI spec, a token in the environment.
PODMAN_CDI = Host(
    tools=_tools("podman", "docker", "crun", "runc", "slirp4netns", "nvidia-ctk"),
    docker="daemon",
    cdi_gpu_specs=("/etc/cdi/nvidia.yaml",),
    cgroup="v2",
    systemd=True,
    euid=1000,
    cap_sys_resource=False,
    rlimits={
        "nofile": (1024, 524288),
        "nproc": (1028000, 1028000),
        "memlock": (-1, -1),
        "stack": (-1, -1),
    },
    cwd="/home/ada/project",
    cwd_uid=1000,
    tty=True,
    driver_version="580.95.05",
    env_names=frozenset({"ENVSPEC_VERIFY", "JUPYTER_TOKEN", "HOME", "PATH"}),
)
# A docker host with the NVIDIA container toolkit.
DOCKER = Host(
    tools=_tools("docker", "runc", "nvidia-container-toolkit"),
    docker="daemon",
    cgroup="v2",
    systemd=True,
    rlimits={
        "nofile": (1048576, 1048576),
        "nproc": (-1, -1),
        "memlock": (-1, -1),
        "stack": (-1, -1),
    },
    cwd="/home/ada/my project",
    cwd_uid=1000,
    tty=True,
    driver_version="580.95.05",
)

CASES = {
    "podman-debian-hybrid": (DEBIAN_HYBRID, {}, ()),
    "podman-cdi-rootless": (PODMAN_CDI, {}, ("python", "train.py", "--epochs", "3")),
    "docker": (DOCKER, {"engine": "docker"}, ()),
}


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / "run" / name
    if REGEN:
        path.write_text(text)
    assert path.is_file(), f"{path} is missing; run with ENVSPEC_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from the golden file; regenerate if intended"


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case):
    host, kw, cmd = CASES[case]
    command = plan_run(_lock(), cmd, host=host, options=RunOptions(**kw))
    _check_golden(f"{case}.txt", "\n".join(run_lines(command)) + "\n")
    assert shlex.split(command.shell()) == command.argv


def test_debian_hybrid_quirks():
    argv = plan_run(_lock(), host=DEBIAN_HYBRID).argv
    assert argv[:3] == ["podman", "--cgroup-manager", "cgroupfs"]
    assert argv[argv.index("--runtime") + 1] == "runc"
    uls = [argv[i + 1] for i, a in enumerate(argv) if a == "--ulimit"]
    assert "nofile=20000:20000" in uls and "nproc=32768:32768" in uls  # pid_max < nproc hard limit
    assert "memlock=8388608:8388608" in uls  # the lock's unlimited, capped to the hard limit
    assert "stack=67108864:67108864" in uls
    assert "--init" not in argv  # the image has tini
    assert "-p" in argv and "127.0.0.1:8888:8888" in argv and "127.0.0.1:2222:2222" in argv
    assert "--device" not in argv and "--gpus" not in argv
    assert argv[-1] == "localhost/envspec/h100-train:" + _lock().meta.content_hash[7:19]


def test_gpu_flags():
    assert "nvidia.com/gpu=all" in plan_run(_lock(), host=PODMAN_CDI).argv
    p = plan_run(
        _lock(), host=DEBIAN_HYBRID
    )  # no NVIDIA driver: nothing to pass through, no warning
    assert "--device" not in p.argv and not any("CDI" in w or "GPU" in w for w in p.warnings)
    assert any("no NVIDIA driver on this machine" in n for n in p.notes)
    assert any("memlock" in n for n in p.notes) and not any("memlock" in w for w in p.warnings)
    gpu_host = replace(
        DEBIAN_HYBRID, driver_version="580.95.05"
    )  # a driver but no CDI spec: a warning
    p = plan_run(_lock(), host=gpu_host)
    assert any("no CDI spec" in w for w in p.warnings) and any("memlock" in w for w in p.warnings)
    d = plan_run(_lock(), host=DOCKER).argv
    assert d[d.index("--gpus") + 1] == "all"
    lk = _lock()
    assert lk.torch is not None
    cpu = lk.model_copy(update={"torch": lk.torch.model_copy(update={"variant": "cpu"})})
    p = plan_run(cpu, host=DEBIAN_HYBRID)
    assert not any("CDI" in w for w in p.warnings) and "--device" not in p.argv


def test_secrets_never_in_argv():
    command = plan_run(_lock(), host=PODMAN_CDI)
    assert "s3cret" not in command.shell()
    assert ["-e", "JUPYTER_TOKEN"] == command.argv[
        command.argv.index("JUPYTER_TOKEN") - 1 : command.argv.index("JUPYTER_TOKEN") + 1
    ]
    assert "s3cret" not in repr(
        detect_host(env={"JUPYTER_TOKEN": "s3cret", "PATH": ""}, ask=())
    )  # names only


def test_bind_elsewhere_warns():
    command = plan_run(_lock(), host=DEBIAN_HYBRID, options=RunOptions(bind="0.0.0.0"))
    assert "0.0.0.0:8888:8888" in command.argv
    assert any("not loopback" in w for w in command.warnings)


def test_no_init_in_image():
    lk = _lock()
    assert lk.debian is not None
    debian = lk.debian.model_copy(
        update={"packages": [p for p in lk.debian.packages if p.name != "tini"]}
    )
    lock = lk.replace_part(debian=debian)
    argv = plan_run(lock, host=DEBIAN_HYBRID).argv
    assert argv[argv.index("--init") + 1 : argv.index("--init") + 3] == [
        "--init-path",
        "/usr/bin/tini",
    ]
    assert "--init" in plan_run(lock, host=DOCKER).argv


def test_root_dir_not_mounted_and_selinux_label():
    p = plan_run(_lock(), host=replace(DEBIAN_HYBRID, cwd="/"))
    assert "-v" not in p.argv and any("current directory is /" in w for w in p.warnings)
    p = plan_run(_lock(), host=replace(DEBIAN_HYBRID, selinux=True))
    assert "/srv/project:/workspace:z" in p.argv


def test_no_engine():
    with pytest.raises(HostError):
        plan_run(_lock(), host=replace(DEBIAN_HYBRID, tools={}, docker=""))
    with pytest.raises(
        HostError
    ):  # a docker client without a daemon, or podman's shim, is no engine
        plan_run(_lock(), host=replace(DEBIAN_HYBRID, tools=_tools("docker"), docker="client"))
    with pytest.raises(UsageError):
        plan_run(_lock(), host=DEBIAN_HYBRID, options=RunOptions(engine="lxc"))


def test_image_target_and_missing_files(tmp_path):
    t = resolve_runnable("docker.io/library/debian:bookworm")
    assert t.lock is None and t.image == "docker.io/library/debian:bookworm"
    p = plan_run(t, ["true"], host=DEBIAN_HYBRID)
    assert p.argv[-2:] == ["docker.io/library/debian:bookworm", "true"]
    assert "--init" in p.argv  # unknown image: podman injects an init
    with pytest.raises(UsageError):
        resolve_runnable(str(tmp_path / "nope.lock"))


def test_lock_and_spec_targets(tmp_path, monkeypatch):
    lockfile = GOLDEN / "diff" / "new.lock"
    t = resolve_runnable(str(lockfile))
    assert (
        t.lock is not None
        and t.image == t.lock.image_tag
        and t.image.startswith("localhost/envspec/h100-train:")
    )
    spec = tmp_path / "specs" / "s.toml"
    spec.parent.mkdir()
    spec.write_text('name = "h100-train"\n[python]\nversion = "3.11"\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as e:
        resolve_runnable(str(spec))
    assert e.value.reference == "lock-not-found"
    (tmp_path / "lockfiles").mkdir()
    (tmp_path / "lockfiles" / "h100-train.lock").write_text(lockfile.read_text())
    t = resolve_runnable(str(spec))
    assert t.image.startswith("localhost/envspec/h100-train:")
    assert t.warnings and "out of date" in t.warnings[0]  # the spec is not the one locked
    with pytest.raises(UsageError) as e:  # a lock without a content hash names no image
        resolve_runnable(
            _lock().model_copy(
                update={"meta": _lock().meta.model_copy(update={"content_hash": ""})}
            )
        )
    assert e.value.reference == "invalid-lock"


def test_podman_args_are_what_plan_run_gives():
    glob, run = podman_args(DEBIAN_HYBRID)
    assert glob == ["--cgroup-manager", "cgroupfs"]
    assert run == [
        "--runtime",
        "runc",
        "--ulimit",
        "nofile=20000:20000",
        "--ulimit",
        "nproc=32768:32768",
    ]
    argv = plan_run(Runnable("docker.io/library/debian:bookworm"), host=DEBIAN_HYBRID).argv
    assert argv[1:3] == glob and all(a in argv for a in run)


def _envspec_images() -> list[str]:
    try:
        out = subprocess.run(
            ["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [ln for ln in out.split() if ln.startswith("localhost/envspec/")]


@pytest.mark.e2e
def test_real_podman_run():
    """Start an envspec image with the argv plan_run gives on this host; skips where podman or an
    envspec image is absent (build one with `envspec build specs/smoke.toml`)."""
    import shutil

    if shutil.which("podman") is None:
        pytest.skip("podman is not installed")
    images = _envspec_images()
    if not images:
        pytest.skip("no localhost/envspec/* image in containers-storage")
    host = detect_host(ask=())
    command = plan_run(
        Runnable(images[0], None, source="image"),
        ["/bin/sh", "-c", "echo envspec-run-ok; ulimit -n"],
        host=replace(host, tty=False),
        options=RunOptions(engine="podman"),
    )
    argv = [a for a in command.argv if a != "-i"]
    env = {**os.environ, "ENVSPEC_VERIFY": "off"}
    cp = subprocess.run(
        argv[: argv.index(images[0])] + ["-e", "ENVSPEC_VERIFY"] + argv[argv.index(images[0]) :],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert cp.returncode == 0, cp.stderr
    assert "envspec-run-ok" in cp.stdout


def test_host_ports():
    argv = plan_run(_lock(), host=DEBIAN_HYBRID, options=RunOptions(host_ports={8888: 18888})).argv
    assert "127.0.0.1:18888:8888" in argv and "127.0.0.1:2222:2222" in argv
    with pytest.raises(UsageError):
        plan_run(_lock(), host=DEBIAN_HYBRID, options=RunOptions(host_ports={9999: 1}))


ROUTES = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0
cni-podman0\t0000580A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
podman0\t0000580A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
"""


def test_a_command_publishes_no_service_port_unless_asked():
    cmd = ("python", "train.py")
    c = plan_run(_lock(), cmd, host=DEBIAN_HYBRID)
    assert "-p" not in c.argv and "ENVSPEC_SERVICES" not in c.argv
    assert any("do not start beside a command" in n for n in c.notes)
    with pytest.raises(UsageError) as e:
        plan_run(_lock(), cmd, host=DEBIAN_HYBRID, options=RunOptions(host_ports={8888: 18888}))
    assert "ENVSPEC_SERVICES" in e.value.hint
    asked = replace(DEBIAN_HYBRID, env_names=frozenset({"ENVSPEC_SERVICES"}))
    c = plan_run(_lock(), cmd, host=asked, options=RunOptions(host_ports={8888: 18888}))
    assert "127.0.0.1:18888:8888" in c.argv and "127.0.0.1:2222:2222" in c.argv
    i = c.argv.index("ENVSPEC_SERVICES")
    assert c.argv[i - 1] == "-e" and i < c.argv.index(
        c.image
    )  # the name only, the value stays here
    assert "-p" in plan_run(_lock(), host=DEBIAN_HYBRID).argv  # no command: the services start


def test_bridge_conflict():
    assert bridge_conflict(ROUTES) == "cni-podman0"
    clean = "\n".join(ln for ln in ROUTES.splitlines() if not ln.startswith("cni-"))
    assert bridge_conflict(clean) == ""
    assert bridge_conflict(ROUTES, bridge="cni-podman0") == "podman0"
    p = plan_run(_lock(), host=DEBIAN_HYBRID)
    assert p.argv[p.argv.index("--network") + 1] == "slirp4netns"
    assert any("ip link delete cni-podman0" in w for w in p.warnings)
    assert (
        "--network" not in plan_run(_lock(), host=replace(DEBIAN_HYBRID, bridge_conflict="")).argv
    )


def test_image_override_keeps_the_lock_settings():
    ref = "ghcr.io/acme/ml/train@sha256:" + "ab" * 32
    p = plan_run(_lock(), ["envspec", "verify"], host=DEBIAN_HYBRID, options=RunOptions(image=ref))
    assert p.argv[-3:] == [ref, "envspec", "verify"] and "--shm-size" in p.argv and "16g" in p.argv
    assert not any("containers-storage" in w for w in p.warnings)


def test_docker_is_checked_before_it_runs_naming_the_daemon_and_the_step():
    from envspec.errors import HostError
    from envspec.host import DockerDaemon
    from envspec.run import RunCommand, check_engine_ready, start_failed

    base = Host(tools={"docker": Tool("/usr/bin/docker")})
    with pytest.raises(
        HostError, match=r"no daemon socket at unix:///var/run/docker.sock \(step: connect"
    ) as e:
        check_engine_ready(replace(base, docker="client"), "docker")
    with pytest.raises(HostError, match=r"no daemon socket at unix:///srv/d.sock \(step: connect"):
        check_engine_ready(
            replace(base, docker="client", docker_host="unix:///srv/d.sock"), "docker"
        )
    assert e.value.reference == "docker-unreachable" and e.value.exit_code == 5
    gone = DockerDaemon(
        "unix:///srv/d.sock", error="Cannot connect to the Docker daemon at unix:///srv/d.sock."
    )
    with pytest.raises(
        HostError, match=r"daemon at unix:///srv/d.sock did not answer .*Cannot connect"
    ):
        check_engine_ready(replace(base, docker="daemon", docker_daemon=gone), "docker")
    check_engine_ready(
        replace(
            base,
            docker="daemon",
            docker_daemon=DockerDaemon("unix:///srv/d.sock", version="20.10.24"),
        ),
        "docker",
    )
    check_engine_ready(base, "podman")  # podman has no daemon to ask
    err = start_failed(RunCommand(["docker", "run", "x"], engine="docker", image="x"), 125)
    assert "docker run could not start the container of x (step: start the container" in err.message
    assert err.reference == "container-start-failed"


def test_an_envspec_image_docker_does_not_have_is_an_error_before_docker_run():
    """docker would try to pull localhost/envspec/... from localhost:80; skopeo's docker-daemon:
    copy exits 0 even when the daemon could not store the image. Ask docker first."""
    from envspec.run import check_docker_image

    host = Host(tools={"docker": Tool("/usr/bin/docker")}, docker="daemon")
    cmd = plan_run(_lock(), host=host, options=RunOptions(engine="docker", mount_cwd=False))
    assert (
        cmd.load_hint
        and cmd.load_hint in cmd.warnings
        and cmd.image.startswith("localhost/envspec/")
    )
    asked: list[list[str]] = []

    def missing(argv):
        asked.append(list(argv))
        return 1, "", f"Error: No such image: {cmd.image}"

    with pytest.raises(
        HostError, match=r"docker's daemon has no image localhost/envspec/.*No such image"
    ) as e:
        check_docker_image(cmd, run=missing)
    assert e.value.reference == "docker-image-missing" and e.value.exit_code == 5
    assert "docker load" in e.value.hint and asked == [
        ["docker", "image", "inspect", "--format", "{{.Id}}", cmd.image]
    ]
    check_docker_image(cmd, run=lambda argv: (0, "sha256:ab\n", ""))  # there: nothing to say
    other = plan_run(
        Runnable("docker.io/library/debian:bookworm"),
        host=host,
        options=RunOptions(engine="docker", mount_cwd=False),
    )
    check_docker_image(other, run=missing)  # not envspec's image: docker pulls it as usual
    assert len(asked) == 1


def test_podman_runs_that_envspec_waits_for_keep_their_exit_code():
    """podman 4.3's --rm races the exit code away (exit 127 "no such exit code"): an attached
    podman run goes without --rm, under a name, and is removed after; the rest keep --rm."""
    from envspec.run import attached

    cmd = plan_run(
        _lock(),
        ["python", "train.py", "--name", "not-podmans"],
        host=DEBIAN_HYBRID,
        options=RunOptions(mount_cwd=False),
    )
    assert "--rm" in cmd.argv  # --print and --json show the plain command
    argv, remove = attached(cmd, "123-abcdef")
    assert (
        "--rm" not in argv
        and argv[-4:] == [cmd.image, "python", "train.py", "--name", "not-podmans"][-4:]
    )
    at = argv.index("run")
    assert argv[at + 1 : at + 3] == ["--name", "envspec-run-123-abcdef"]
    assert remove == [*argv[:at], "rm", "--force", "--ignore", "envspec-run-123-abcdef"]
    assert argv[:at] == cmd.argv[: cmd.argv.index("run")]  # the same storage and cgroup options
    named = plan_run(_lock(), host=DEBIAN_HYBRID, options=RunOptions(name="mine", mount_cwd=False))
    argv, remove = attached(named, "x")
    assert argv.count("--name") == 1 and remove[-1] == "mine"
    detached = plan_run(
        _lock(), host=DEBIAN_HYBRID, options=RunOptions(detach=True, mount_cwd=False)
    )
    assert attached(detached, "x") == (detached.argv, [])  # nobody waits: --rm stays
    docker = plan_run(_lock(), host=DOCKER, options=RunOptions(engine="docker", mount_cwd=False))
    assert attached(docker, "x") == (docker.argv, [])


def test_docker_ulimits_are_capped_where_a_local_daemon_cannot_raise_them():
    lock = load(Path(__file__).resolve().parents[2] / "lockfiles" / "cpu.lock")  # memlock = -1
    host = Host(cap_sys_resource=False, docker="daemon", rlimits={"memlock": (8388608, 8388608)})
    argv = plan_run(lock, host=host, options=RunOptions(engine="docker", mount_cwd=False)).argv
    assert "memlock=8388608:8388608" in " ".join(argv) and "nofile" not in " ".join(
        argv
    )  # no podman defaults
    remote = replace(
        host, docker_host="tcp://10.0.0.2:2376"
    )  # another machine's limits: not ours to cap
    assert "memlock=-1:-1" in " ".join(
        plan_run(lock, host=remote, options=RunOptions(engine="docker", mount_cwd=False)).argv
    )


def test_docker_without_the_nvidia_toolkit_gets_no_gpu_flag_and_a_warning():
    from envspec.host import DockerDaemon

    lock = load(GOLDEN / "diff" / "new.lock")  # a GPU lock
    bare = replace(DOCKER, tools=_tools("docker", "runc"))
    cmd = plan_run(lock, host=bare, options=RunOptions(engine="docker"))
    assert (
        "--gpus" not in cmd.argv
    )  # the daemon would refuse it: could not select device driver "" ...
    assert any("the container gets no GPU" in w for w in cmd.warnings)
    nvidia = DockerDaemon(
        "unix:///var/run/docker.sock", version="28.2.2", runtimes=("nvidia", "runc")
    )
    assert (
        "--gpus"
        in plan_run(
            lock, host=replace(bare, docker_daemon=nvidia), options=RunOptions(engine="docker")
        ).argv
    )
    assert (
        "--gpus"
        in plan_run(
            lock,
            host=replace(bare, docker_host="tcp://gpu-box:2376"),
            options=RunOptions(engine="docker"),
        ).argv
    )


def test_start_lines_name_the_services_their_addresses_and_a_command(tmp_path):
    lock = load(Path(__file__).resolve().parents[2] / "lockfiles" / "smoke.lock")
    plain = start_lines("specs/smoke.toml", lock)
    assert (
        plain[0] == "start a shell in it: envspec run specs/smoke.toml"
        and "no services" in plain[1]
    )
    assert "envspec run specs/smoke.toml -- python train.py" in "\n".join(plain)
    with_services = lock.model_copy(
        update={"services": Services(jupyter=Jupyter(port=8888), ssh=Ssh(port=2222))}
    )
    lines = start_lines("lockfiles/x.lock", with_services, image="registry.example/x@sha256:ab")
    assert lines[0] == (
        "start it with JupyterLab and SSH: envspec run lockfiles/x.lock --image "
        "registry.example/x@sha256:ab"
    )
    assert any("http://127.0.0.1:8888/lab" in ln for ln in lines)
    assert any(f"ssh -p 2222 {lock.runtime.user}@127.0.0.1" in ln for ln in lines)
    # the same addresses `envspec run` prints when it starts them
    notes = [
        n
        for n in plan_run(Runnable.of_lock(with_services), [], host=DEBIAN_HYBRID).notes
        if n.startswith(("Jupyter", "SSH"))
    ]
    assert all(any(n in ln for ln in lines) for n in notes) and notes


def test_an_envspec_image_the_store_does_not_have_is_an_error_before_podman_run():
    """podman would try to pull localhost/envspec/... from localhost:443 and print three retries'
    network errors; ask the run's own store first (its --root/--runroot)."""
    from envspec.run import check_podman_image

    host = Host(tools={"podman": Tool("/usr/bin/podman"), "runc": Tool("/usr/bin/runc")}, euid=0)
    cmd = plan_run(_lock(), host=host, options=RunOptions(mount_cwd=False))
    asked: list[list[str]] = []

    def answer(rc):
        def run(argv):
            asked.append(list(argv))
            return rc, "", ""

        return run

    with pytest.raises(
        HostError, match=r"the image localhost/envspec/.* is not in this store"
    ) as e:
        check_podman_image(cmd, source="specs/x.toml", run=answer(1))
    assert e.value.reference == "image-not-built" and e.value.exit_code == 5
    assert "envspec build specs/x.toml" in e.value.hint
    head = cmd.argv[: cmd.argv.index("run")]
    assert asked == [[*head, "image", "exists", cmd.image]]
    check_podman_image(cmd, run=answer(0))  # there
    check_podman_image(cmd, run=answer(125))  # podman's own trouble: podman run says it
    other = plan_run(
        Runnable("docker.io/library/debian:bookworm"),
        host=host,
        options=RunOptions(mount_cwd=False),
    )
    check_podman_image(other, run=answer(1))  # not envspec's image: podman pulls it as usual
    assert len(asked) == 3


def test_a_capped_limit_is_said_in_bytes_and_size_where_it_counts_bytes():
    from envspec.host import UNLIMITED
    from envspec.run import _limit_text

    assert _limit_text("memlock", 8388608) == "8388608 (8.0 MiB)"
    assert _limit_text("stack", 67108864) == "67108864 (64.0 MiB)"
    assert _limit_text("nofile", 1048576) == "1048576"  # files, not bytes
    assert _limit_text("memlock", UNLIMITED) == "unlimited"
