"""Jupyter and SSH in a real image under podman, started with the argv ``envspec run`` plans.

What it shows (issue 5): Jupyter answers 200 with the token and 403 without, on loopback; SSH
accepts the key and refuses a password and root; two containers of one image have different SSH
host keys; the generated Jupyter token is printed once. Issue 15: a command given runs alone (no
Jupyter, no sshd, nothing printed about them), and ENVSPEC_SERVICES=jupyter starts Jupyter beside
a command.

The image is built from examples/workstation/workstation.toml (a GPU lock: ~3 GB of wheels on
the first run, cached after) into the system's containers-storage under its default tag, so a
second run reuses it. ENVSPEC_E2E_SERVICES_SPEC=path/to/spec.toml builds another spec instead
(any spec with both services). The containers run with ENVSPEC_VERIFY=warn (the startup check
reports and goes on): on a host without a GPU a GPU lock's services must still be testable.

The docker case (the same image copied into a dockerd of our own, started with
``envspec run --engine docker -d``) skips where docker.io is absent.

Skips only where buildah, skopeo or podman are absent.
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = Path(
    os.environ.get("ENVSPEC_E2E_SERVICES_SPEC")
    or ROOT / "examples" / "workstation" / "workstation.toml"
)

pytestmark = [pytest.mark.e2e, pytest.mark.network, pytest.mark.slow]
for _tool in ("buildah", "skopeo", "podman"):
    if shutil.which(_tool) is None:
        pytestmark.append(
            pytest.mark.skip(reason=f"{_tool} is not installed (apt-get install -y {_tool})")
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    from envspec.host import ASK_NONE, detect_host
    from envspec.run import podman_args

    glob, _run = podman_args(detect_host(ask=ASK_NONE))
    return subprocess.run(
        ["podman", *glob, *args], capture_output=True, text=True, check=check, timeout=timeout
    )


def _sh_in_image(ref: str, script: str) -> subprocess.CompletedProcess:
    """``sh -c script`` in a fresh container of ``ref``, bypassing the entrypoint (no services),
    with the host quirks plan_run handles (runtime, ulimits)."""
    from conftest import in_image

    return in_image(ref, "/bin/sh", ["-c", script])


_LOCKFILE: dict[str, Path] = {}  # the lockfile the image fixture wrote


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """(lock, image ref): the spec locked into a temporary lockfile and built; the image is
    removed from the store once the module's tests ran."""
    from envspec import lock as lockmod
    from envspec import sources
    from envspec.cache.store import Cache
    from envspec.image import BuildahEngine, BuildOptions, build
    from envspec.plan import make_plan

    out = tmp_path_factory.mktemp("lock") / "services.lock"
    cp = subprocess.run(
        [sys.executable, "-m", "envspec", "lock", str(SPEC), "-o", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        timeout=1800,
    )
    assert cp.returncode == 0, f"envspec lock {SPEC} failed:\n{cp.stdout}\n{cp.stderr}"
    lock = lockmod.load(out)
    _LOCKFILE["path"] = out
    assert lock.services.enabled() == ["jupyter", "ssh"], (
        f"{SPEC} must enable both [services.jupyter] and [services.ssh]"
    )
    # the files the spec names (authorized_keys) are read beside the spec, as `envspec build` does
    built = build(
        make_plan(lock),
        BuildahEngine(),
        Cache(),
        sources.discover().mirrors,
        options=BuildOptions(spec_dir=lockmod.lock_base(out) / Path(lock.meta.spec).parent),
    )
    assert (
        lockmod.lock_base(out) / lock.meta.spec
    ).resolve() == SPEC.resolve()  # [meta].spec: from the lock's folder
    ls = _sh_in_image(built.image, "ls /opt/envspec/services/")
    if "jupyter.sh" not in ls.stdout or "ssh.sh" not in ls.stdout:
        pytest.fail(
            f"{built.image} has no /opt/envspec/services/{{jupyter,ssh}}.sh: the build's envspec layer must "
            f"include envspec.services.render_service_files(lock, spec_dir=...) ({ls.stdout}{ls.stderr})"
        )
    yield lock, built.image
    # the image is this module's: it leaves the store as it found it (the layers stay in the cache)
    subprocess.run(["podman", "rmi", "--ignore", built.image], capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def client_key(tmp_path_factory):
    import paramiko

    key = paramiko.RSAKey.generate(2048)
    return key, f"{key.get_name()} {key.get_base64()} envspec-e2e"


@pytest.fixture(scope="module")
def containers(image, client_key, tmp_path_factory):
    """Two containers of the image, started with plan_run's argv; each on its own loopback ports."""
    from envspec.host import ASK_NONE, detect_host
    from envspec.run import Runnable, RunOptions, plan_run

    lock, ref = image
    uid = lock.runtime.uid
    assert lock.services.jupyter is not None and lock.services.ssh is not None
    jport, sport = lock.services.jupyter.port, lock.services.ssh.port
    started = []
    out = {}
    for n, token in (("a", "e2e-token-0123456789abcdef"), ("b", "")):
        ws = tmp_path_factory.mktemp(f"ws-{n}")
        if os.geteuid() == 0:
            os.chown(ws, uid, uid)  # the image's user writes /workspace
        env = {**os.environ, "ENVSPEC_VERIFY": "warn", "ENVSPEC_AUTHORIZED_KEYS": client_key[1]}
        env.pop("JUPYTER_TOKEN", None)
        if token:
            env["JUPYTER_TOKEN"] = token
        host = replace(detect_host(env=env, ask=ASK_NONE, cwd=str(ws)), tty=False)
        hj, hs = _free_port(), _free_port()
        name = f"envspec-e2e-services-{n}-{os.getpid()}"
        command = plan_run(
            Runnable(ref, lock),
            host=host,
            options=RunOptions(detach=True, name=name, host_ports={jport: hj, sport: hs}),
        )
        assert (
            f"127.0.0.1:{hj}:{jport}" in command.argv and f"127.0.0.1:{hs}:{sport}" in command.argv
        )
        assert (
            not token or token not in command.shell()
        )  # the token travels in the environment only
        cp = subprocess.run(command.argv, capture_output=True, text=True, env=env, timeout=300)
        assert cp.returncode == 0, f"{command.shell()}\n{cp.stderr}"
        started.append(name)
        out[n] = {"name": name, "jupyter": hj, "ssh": hs, "token": token, "user": lock.runtime.user}
    try:
        for c in out.values():
            _wait_port(c["jupyter"], c["name"], "http")
            _wait_port(c["ssh"], c["name"], "ssh")
        yield out
    finally:
        for name in started:
            _podman("rm", "-f", "-t", "5", name, check=False)


def _wait_port(port: int, name: str, kind: str, timeout: float = 180, logs=None) -> None:
    """Wait until ``port`` answers HTTP (kind "http": any status) or an SSH banner (kind "ssh")."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            if kind == "http":
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=3):
                        return
                except urllib.error.HTTPError:
                    return  # an HTTP answer (403): the server is up
            else:
                with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
                    s.settimeout(3)
                    if s.recv(4).startswith(b"SSH-"):
                        return
        except (OSError, http.client.HTTPException):
            pass
        if "Traceback (most recent call last)" in (
            logs() if logs else _logs(name)
        ):  # a service died
            break
        time.sleep(2)
    said = logs() if logs else _logs(name)
    pytest.fail(f"port {port} ({kind}) of {name} did not answer; logs:\n{said[-4000:]}")


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _logs(name: str) -> str:
    cp = _podman("logs", name, check=False)
    return cp.stdout + cp.stderr


def test_jupyter_needs_the_token(containers):
    a = containers["a"]
    base = f"http://127.0.0.1:{a['jupyter']}/api/status"
    assert _status(f"{base}?token={a['token']}") == 200
    assert _status(base) == 403
    assert _status(f"{base}?token=wrong") == 403
    assert a["token"] not in _logs(a["name"])  # a token given at run time is never printed


def test_generated_token_is_printed_once(containers):
    import re

    b = containers["b"]
    logs = _logs(b["name"])
    tokens = re.findall(r"token=([0-9a-f]{48})", logs)
    assert len(tokens) == 1, logs[-2000:]
    assert _status(f"http://127.0.0.1:{b['jupyter']}/api/status?token={tokens[0]}") == 200
    assert _status(f"http://127.0.0.1:{b['jupyter']}/api/status") == 403


def test_ssh_key_yes_password_no_root_no(containers, client_key):
    import paramiko

    a = containers["a"]
    key = client_key[0]
    c = paramiko.SSHClient()
    c.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    c.connect(
        "127.0.0.1",
        port=a["ssh"],
        username=a["user"],
        pkey=key,
        allow_agent=False,
        look_for_keys=False,
        timeout=20,
    )
    _, out, _ = c.exec_command("id -un; pwd; command -v python")
    lines = out.read().decode().split()
    c.close()
    assert lines[0] == a["user"] and lines[1] == "/workspace" and lines[2].endswith("/bin/python")

    t = paramiko.Transport(("127.0.0.1", a["ssh"]))
    t.start_client(timeout=20)
    with pytest.raises(
        paramiko.AuthenticationException
    ) as e:  # BadAuthenticationType is a subclass
        t.auth_password(a["user"], a["user"])
    assert getattr(e.value, "allowed_types", ["publickey"]) == ["publickey"]
    t.close()

    t = paramiko.Transport(("127.0.0.1", a["ssh"]))
    t.start_client(timeout=20)
    with pytest.raises(paramiko.AuthenticationException):
        t.auth_publickey("root", key)
    t.close()


def test_two_containers_have_different_host_keys(containers):
    import paramiko

    keys = []
    for n in ("a", "b"):
        t = paramiko.Transport(("127.0.0.1", containers[n]["ssh"]))
        t.start_client(timeout=20)
        keys.append(t.get_remote_server_key().get_fingerprint())
        t.close()
    assert keys[0] != keys[1]


_PROCESSES = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < \"$f\"; echo; done 2>/dev/null"


def _run_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ENVSPEC_SERVICES", "JUPYTER_TOKEN")}
    return {**env, "ENVSPEC_VERIFY": "warn", **extra}


def test_a_command_runs_alone(image, tmp_path):
    """`podman run IMAGE CMD` (as envspec run -- CMD plans it): the entrypoint starts no service."""
    from envspec.host import ASK_NONE, detect_host
    from envspec.run import Runnable, RunOptions, plan_run

    lock, ref = image
    env = _run_env()
    host = replace(detect_host(env=env, ask=ASK_NONE), tty=False)
    # the services, had they been started, would be running by now: they are forked before the command
    command = plan_run(
        Runnable(ref, lock),
        ["sh", "-c", f"sleep 3; {_PROCESSES}; echo command-ran"],
        host=host,
        options=RunOptions(mount_cwd=False),
    )
    assert not any(a.startswith("127.0.0.1:") for a in command.argv)  # no port published either
    cp = subprocess.run(command.argv, capture_output=True, text=True, env=env, timeout=300)
    assert cp.returncode == 0, f"{command.shell()}\n{cp.stdout}\n{cp.stderr}"
    assert cp.stdout.rstrip().endswith("command-ran")
    procs = cp.stdout.lower()
    assert "jupyter" not in procs and "sshd" not in procs, cp.stdout
    said = cp.stderr.lower()
    assert (
        "serverapp" not in said
        and "jupyter" not in said
        and "sshd" not in said
        and "services" not in said
    ), cp.stderr


def test_services_asked_for_beside_a_command(image, tmp_path):
    """ENVSPEC_SERVICES=jupyter and a command: Jupyter answers (with the token), sshd is not started."""
    from envspec.host import ASK_NONE, detect_host
    from envspec.run import Runnable, RunOptions, plan_run

    lock, ref = image
    assert lock.services.jupyter is not None and lock.services.ssh is not None
    token = "e2e-beside-0123456789abcdef"
    env = _run_env(ENVSPEC_SERVICES="jupyter", JUPYTER_TOKEN=token)
    ws = tmp_path / "ws"
    ws.mkdir()
    if os.geteuid() == 0:
        os.chown(ws, lock.runtime.uid, lock.runtime.uid)
    host = replace(detect_host(env=env, ask=ASK_NONE, cwd=str(ws)), tty=False)
    hj, hs = _free_port(), _free_port()
    name = f"envspec-e2e-beside-{os.getpid()}"
    command = plan_run(
        Runnable(ref, lock),
        ["sleep", "600"],
        host=host,
        options=RunOptions(
            detach=True,
            name=name,
            host_ports={lock.services.jupyter.port: hj, lock.services.ssh.port: hs},
        ),
    )
    assert "ENVSPEC_SERVICES" in command.argv and token not in command.shell()
    cp = subprocess.run(command.argv, capture_output=True, text=True, env=env, timeout=300)
    assert cp.returncode == 0, f"{command.shell()}\n{cp.stderr}"
    try:
        _wait_port(hj, name, "http")
        assert _status(f"http://127.0.0.1:{hj}/api/status?token={token}") == 200
        assert _status(f"http://127.0.0.1:{hj}/api/status") == 403
        ps = _podman("exec", name, "sh", "-c", _PROCESSES, check=False)
        assert "jupyter" in ps.stdout.lower() and "sshd" not in ps.stdout.lower(), (
            ps.stdout + ps.stderr
        )
        assert "sleep 600" in ps.stdout  # the command itself runs beside it
    finally:
        _podman("rm", "-f", "-t", "5", name, check=False)


def test_no_host_key_in_the_image(image):
    _lock, ref = image
    cp = _sh_in_image(ref, "ls -d /etc/ssh/ssh_host_* /tmp/envspec-* 2>/dev/null; true")
    assert cp.returncode == 0, cp.stderr
    assert "ssh_host_" not in cp.stdout and "/tmp/envspec-" not in cp.stdout


# --- the same services under docker ----------------------------------------------------------------
# Debian's dockerd of our own (conftest.start_dockerd), the image copied into it from
# containers-storage, the container started by the `envspec run --engine docker -d` command line.


@pytest.fixture(scope="module")
def docker_services(image, client_key, tmp_path_factory):
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        pytest.skip(
            "docker.io is not installed (apt-get install -y docker.io), or not root (our own dockerd)"
        )
    from conftest import start_dockerd

    lock, ref = image
    assert lock.services.jupyter is not None and lock.services.ssh is not None
    work = tmp_path_factory.mktemp("docker-services")
    ws = work / "ws"
    ws.mkdir()
    os.chown(ws, lock.runtime.uid, lock.runtime.uid)
    with start_dockerd(subnet="172.29.1.1/24") as d:
        from envspec.host import ASK_NONE, detect_host

        src = detect_host(ask=ASK_NONE).storage.ref(ref)
        cp = subprocess.run(
            [
                "skopeo",
                "copy",
                "--quiet",
                "--dest-daemon-host",
                d.address,
                src,
                f"docker-daemon:{ref}",
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert cp.returncode == 0, cp.stderr
        # skopeo exits 0 even when the daemon failed to store the image (a full disk): ask docker
        if d.docker("image", "inspect", ref, check=False).returncode != 0:
            df = subprocess.run(["df", "-h", str(d.base)], capture_output=True, text=True).stdout
            raise AssertionError(
                f"skopeo copy exited 0 but dockerd has no {ref}; free space:\n{df}\n"
                f"dockerd's log:\n{d.log()[-3000:]}"
            )
        hj, hs = _free_port(), _free_port()
        token = "e2e-docker-token-0123456789abcdef"
        name = f"envspec-e2e-docker-{os.getpid()}"
        env = {
            **d.env,
            "ENVSPEC_VERIFY": "warn",
            "ENVSPEC_AUTHORIZED_KEYS": client_key[1],
            "JUPYTER_TOKEN": token,
            "PYTHONPATH": str(ROOT / "src"),
        }
        cp = subprocess.run(
            [
                sys.executable,
                "-m",
                "envspec",
                "run",
                "--engine",
                "docker",
                "-d",
                "--name",
                name,
                "--image",
                ref,
                "--port",
                f"{hj}:{lock.services.jupyter.port}",
                "--port",
                f"{hs}:{lock.services.ssh.port}",
                str(_LOCKFILE["path"]),
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=ws,
            timeout=300,
        )
        assert cp.returncode == 0, cp.stdout + cp.stderr
        assert token not in cp.stdout + cp.stderr

        def logs() -> str:
            out = d.docker("logs", name, check=False)
            return out.stdout + out.stderr

        try:
            _wait_port(hj, name, "http", logs=logs)
            _wait_port(hs, name, "ssh", logs=logs)
            yield {
                "name": name,
                "jupyter": hj,
                "ssh": hs,
                "token": token,
                "user": lock.runtime.user,
                "logs": logs,
            }
        finally:
            d.docker("rm", "-f", name, check=False)


def test_docker_jupyter_needs_the_token(docker_services):
    c = docker_services
    base = f"http://127.0.0.1:{c['jupyter']}/api/status"
    assert _status(f"{base}?token={c['token']}") == 200
    assert _status(base) == 403
    assert _status(f"{base}?token=wrong") == 403
    assert c["token"] not in c["logs"]()


def test_docker_ssh_takes_the_key_and_refuses_a_password(docker_services, client_key):
    import paramiko

    c = docker_services
    cl = paramiko.SSHClient()
    cl.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    cl.connect(
        "127.0.0.1",
        port=c["ssh"],
        username=c["user"],
        pkey=client_key[0],
        allow_agent=False,
        look_for_keys=False,
        timeout=20,
    )
    _, out, _ = cl.exec_command("id -un; pwd")
    assert out.read().decode().split() == [c["user"], "/workspace"]
    cl.close()
    t = paramiko.Transport(("127.0.0.1", c["ssh"]))
    t.start_client(timeout=20)
    with pytest.raises(paramiko.AuthenticationException) as e:
        t.auth_password(c["user"], c["user"])
    assert getattr(e.value, "allowed_types", ["publickey"]) == ["publickey"]
    t.close()
