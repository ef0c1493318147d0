"""Services in the image: the entrypoint and the Jupyter/SSH files rendered from a lock, and the
spec's bad-input checks for [services]. The running services are tested in tests/e2e/test_services.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from envspec.errors import PlanError, SpecError
from envspec.lock import Lockfile
from envspec.services import (
    AUTHORIZED_KEYS_IN_IMAGE,
    ENTRYPOINT_IN_IMAGE,
    check_authorized_keys,
    render_service_files,
)
from envspec.spec import parse_spec

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
EXAMPLE_KEYS = Path(__file__).resolve().parents[2] / "examples" / "workstation" / "authorized_keys"
PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBkP1F5JmVxKs7mZAKq5Ck1zb7yV8pS0uEo2a5gG9bY4 ada@laptop"


def _data(jupyter=True, ssh=True, keys="") -> dict:
    d = tomllib.loads((GOLDEN / "diff" / "new.lock").read_text())
    d["services"] = {}
    if jupyter:
        d["services"]["jupyter"] = {"enabled": True, "port": 8888, "extensions": []}
    if ssh:
        d["services"]["ssh"] = {"enabled": True, "port": 2222, "authorized_keys": keys}
    return d


def _lock(jupyter=True, ssh=True, keys="") -> Lockfile:
    return Lockfile.model_validate(_data(jupyter, ssh, keys)).with_hash()


def test_files_and_modes():
    files = render_service_files(_lock(), authorized_keys=PUB + "\n")
    assert sorted(files) == [
        AUTHORIZED_KEYS_IN_IMAGE,
        ENTRYPOINT_IN_IMAGE,
        "/opt/envspec/services/jupyter.sh",
        "/opt/envspec/services/ssh.sh",
        "/opt/envspec/services/sshd_config",
    ]
    modes = {p: m for p, (_t, m) in files.items()}
    assert (
        modes[ENTRYPOINT_IN_IMAGE] == 0o755 and modes["/opt/envspec/services/sshd_config"] == 0o644
    )
    assert files[AUTHORIZED_KEYS_IN_IMAGE][0] == PUB + "\n"
    for text, _m in files.values():
        assert text.endswith("\n") and "{{" not in text and "{%" not in text


def test_no_services_only_entrypoint():
    files = render_service_files(_lock(jupyter=False, ssh=False))
    assert list(files) == [ENTRYPOINT_IN_IMAGE]
    ep = files[ENTRYPOINT_IN_IMAGE][0]
    assert '"$SERVICES/' not in ep and "wait" not in ep.split("set -eu", 1)[1]
    assert 'exec "$@"' in ep


def test_disabled_service_is_not_rendered():
    lock = _data()
    lock["services"]["ssh"]["enabled"] = False
    files = render_service_files(Lockfile.model_validate(lock))
    assert "/opt/envspec/services/ssh.sh" not in files
    assert "ssh.sh" not in files[ENTRYPOINT_IN_IMAGE][0]


def test_nothing_secret_is_baked():
    files = render_service_files(_lock(), authorized_keys=PUB + "\n")
    blob = "\n".join(t for t, _ in files.values())
    assert "PRIVATE KEY" not in blob
    assert not re.search(r"token=[0-9a-f]{16,}", blob)  # no token value: generated at start
    assert not re.search(r"(?i)password\s*=\s*['\"][^'\"]+", blob)
    # host keys are made at the container's first start, in a writable dir, never shipped
    assert not any("ssh_host_" in p for p in files)
    assert "ssh-keygen -q -t" in files["/opt/envspec/services/ssh.sh"][0]


def test_jupyter_always_needs_a_token():
    j = render_service_files(_lock())["/opt/envspec/services/jupyter.sh"][0]
    assert "secrets.token_hex" in j and "JUPYTER_TOKEN" in j
    assert "--ip=0.0.0.0" in j and "--port=8888" in j and "--ServerApp.root_dir=/workspace" in j
    # the token travels in the environment, never on jupyter's command line
    assert (
        "--IdentityProvider.token" not in j
        and "--ServerApp.token" not in j
        and "--NotebookApp.token" not in j
    )
    assert "allow_password_change=False" in j
    assert 'if [ -z "$token" ]' in j  # an empty JUPYTER_TOKEN does not disable auth


def test_sshd_config_policy():
    cfg = render_service_files(_lock())["/opt/envspec/services/sshd_config"][0]
    want = [
        "Port 2222",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin no",
        "UsePAM no",
        "AuthenticationMethods publickey",
        "AllowUsers envspec",
        "PermitEmptyPasswords no",
        "PidFile /tmp/envspec-1000/ssh/sshd.pid",
        "AuthorizedKeysFile /tmp/envspec-1000/ssh/authorized_keys",
        "HostKey /tmp/envspec-1000/ssh/ssh_host_ed25519_key",
    ]
    lines = cfg.splitlines()
    for w in want:
        assert w in lines, w
    assert 'SetEnv "PATH=/opt/venv/bin:' in cfg and '"NCCL_DEBUG=WARN"' in cfg


def test_ssh_script_uses_baked_and_runtime_keys():
    s = render_service_files(_lock())["/opt/envspec/services/ssh.sh"][0]
    assert AUTHORIZED_KEYS_IN_IMAGE in s and "ENVSPEC_AUTHORIZED_KEYS" in s
    assert "exec /usr/sbin/sshd -D -e -f /opt/envspec/services/sshd_config" in s


def test_entrypoint_verify_and_services():
    ep = render_service_files(_lock())[ENTRYPOINT_IN_IMAGE][0]
    assert "-m envspec.verify --startup" in ep and "PYTHONPATH=/opt/envspec/lib" in ep
    assert "off|OFF|0|no|false" in ep and '"${ENVSPEC_VERIFY:-warn}"' in ep
    assert '"$SERVICES/$s.sh" &' in ep and "jupyter|ssh)" in ep and 's="jupyter ssh"' in ep
    assert 'if [ "$(id -u)" = 0 ]' in ep  # services never as root


def _run_entrypoint(
    tmp_path: Path,
    args: list[str],
    services_env: str | None,
    *,
    uid: int = 1000,
    jupyter: bool = True,
    ssh: bool = True,
) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The rendered entrypoint under sh, its services stubbed (each writes a file named after
    itself), `id -u` answering ``uid``, the start-up check off. Returns (result, services started)."""
    ep = render_service_files(_lock(jupyter, ssh))[ENTRYPOINT_IN_IMAGE][0]
    svc = tmp_path / "services"
    bin_ = tmp_path / "bin"
    for d in (svc, bin_):
        d.mkdir(exist_ok=True)
    for name in ("jupyter", "ssh"):
        stub = svc / f"{name}.sh"
        stub.write_text(f"#!/bin/sh\necho started > {tmp_path}/{name}.started\n")
        stub.chmod(0o755)
    (bin_ / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (bin_ / "id").chmod(0o755)
    script = tmp_path / "entrypoint.sh"
    script.write_text(ep.replace("SERVICES=/opt/envspec/services", f"SERVICES={svc}"))
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "ENVSPEC_VERIFY": "off", "HOME": str(tmp_path)}
    if services_env is not None:
        env["ENVSPEC_SERVICES"] = services_env
    for f in tmp_path.glob("*.started"):
        f.unlink()
    # a command that waits (up to 5 s) for a service asked for to have started, then lists them
    cp = subprocess.run(
        ["sh", str(script), *args], capture_output=True, text=True, env=env, input="", timeout=60
    )
    return cp, sorted(f.name.split(".")[0] for f in tmp_path.glob("*.started"))


WAIT_CMD = [
    "sh",
    "-c",
    'for i in 1 2 3 4 5 6 7 8 9 10; do [ -n "$(ls "$0"/*.started 2>/dev/null)" ] && break; '
    "sleep 0.5; done; echo command ran",
]


@pytest.mark.skipif(shutil.which("sh") is None, reason="no sh")
def test_a_command_runs_alone(tmp_path):
    cp, started = _run_entrypoint(tmp_path, [*WAIT_CMD, str(tmp_path)], None)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == "command ran\n" and started == []
    assert "services" not in cp.stderr  # nothing said about services either
    cp, started = _run_entrypoint(tmp_path, ["true"], "none")
    assert cp.returncode == 0 and started == []


@pytest.mark.skipif(shutil.which("sh") is None, reason="no sh")
def test_services_start_without_a_command_or_when_asked(tmp_path):
    cp, started = _run_entrypoint(tmp_path, [], None)
    assert started == ["jupyter", "ssh"], cp.stderr
    assert "services started (jupyter ssh)" in cp.stderr
    cp, started = _run_entrypoint(tmp_path, [*WAIT_CMD, str(tmp_path)], "jupyter")
    assert cp.stdout == "command ran\n" and started == ["jupyter"], cp.stderr
    cp, started = _run_entrypoint(tmp_path, [*WAIT_CMD, str(tmp_path)], "all")
    assert started == ["jupyter", "ssh"], cp.stderr
    cp, started = _run_entrypoint(tmp_path, [], "ssh, jupyter,ssh")
    assert started == ["jupyter", "ssh"] and "services started (ssh jupyter)" in cp.stderr
    cp, started = _run_entrypoint(tmp_path, [], "none")  # no services: the shell (stdin empty) ends
    assert cp.returncode == 0 and started == [] and "services started" not in cp.stderr


@pytest.mark.skipif(shutil.which("sh") is None, reason="no sh")
def test_services_asked_for_wrongly(tmp_path):
    cp, started = _run_entrypoint(tmp_path, [*WAIT_CMD, str(tmp_path)], "jupyter,notebook,*")
    assert started == ["jupyter"], cp.stderr
    assert "this image has no service 'notebook' (it has jupyter, ssh; or all, none)" in cp.stderr
    assert "no service '*'" in cp.stderr  # not globbed
    cp, started = _run_entrypoint(tmp_path, ["true"], "all", uid=0)
    assert (
        cp.returncode == 0
        and started == []
        and "running as root: services (jupyter ssh)" in cp.stderr
    )
    cp, started = _run_entrypoint(tmp_path, ["true"], "jupyter", jupyter=False, ssh=False)
    assert (
        cp.returncode == 0 and "ENVSPEC_SERVICES=jupyter: this image has no services" in cp.stderr
    )


@pytest.mark.skipif(shutil.which("sh") is None, reason="no sh")
def test_scripts_parse_as_posix_sh():
    files = render_service_files(_lock(), authorized_keys=PUB + "\n")
    for path, (text, mode) in files.items():
        if mode & 0o111:
            cp = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True)
            assert cp.returncode == 0, f"{path}: {cp.stderr}"


def test_sshd_accepts_the_config(tmp_path):
    sshd = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
    if sshd is None or shutil.which("ssh-keygen") is None:
        pytest.skip("openssh-server is not installed here")
    cfg = render_service_files(_lock())["/opt/envspec/services/sshd_config"][0]
    cfg = cfg.replace("/tmp/envspec-1000/ssh", str(tmp_path))
    for t in ("ed25519", "ecdsa"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", t, "-N", "", "-f", str(tmp_path / f"ssh_host_{t}_key")],
            check=True,
        )
    (tmp_path / "sshd_config").write_text(cfg)
    if os.geteuid() == 0:  # as root, sshd -t insists on its privilege separation directory
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    cp = subprocess.run(
        [sshd, "-t", "-f", str(tmp_path / "sshd_config")], capture_output=True, text=True
    )
    if "privilege separation directory" in cp.stderr:
        pytest.skip("sshd -t as root wants /run/sshd, which this host lacks")
    assert cp.returncode == 0, cp.stderr


def test_keys_from_the_spec_dir(tmp_path):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "team.pub").write_text(f"# the team\n{PUB}\n\n")
    files = render_service_files(_lock(keys="keys/team.pub"), spec_dir=tmp_path)
    assert files[AUTHORIZED_KEYS_IN_IMAGE][0] == f"# the team\n{PUB}\n"
    with pytest.raises(PlanError) as e:
        render_service_files(_lock(keys="keys/missing.pub"), spec_dir=tmp_path)
    assert e.value.reference == "missing-file"


def test_example_keys_file_is_valid():
    assert EXAMPLE_KEYS.is_file()
    assert check_authorized_keys(EXAMPLE_KEYS.read_text()).count("ssh-ed25519") == 1


def test_private_key_or_junk_is_refused():
    with pytest.raises(PlanError) as e:
        check_authorized_keys(
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----\n"
        )
    assert e.value.reference == "private-key-in-spec"
    with pytest.raises(PlanError):
        check_authorized_keys("hello world\n")
    assert check_authorized_keys(f'from="10.0.0.0/8",no-agent-forwarding {PUB}\n').startswith(
        "from="
    )


# --- bad input in [services], through the spec stage -----------------------------------------------


def _problems(text: str, file: Path) -> list:
    with pytest.raises(SpecError) as e:
        parse_spec(text, file)
    return e.value.problems()


def test_unknown_service_key_is_refused(tmp_path):
    # no password-less or password mode can be configured: such keys do not exist
    ps = _problems(
        'name = "x"\n[services.jupyter]\nport = 8888\npassword = "hunter2"\n', tmp_path / "s.toml"
    )
    assert [(p.reference, p.path, p.line) for p in ps] == [
        ("unknown-key", "[services.jupyter].password", 4)
    ]
    ps = _problems(
        'name = "x"\n[services.ssh]\nport = 2222\nauthorised_keys = "k.pub"\n', tmp_path / "s.toml"
    )
    assert ps[0].reference == "unknown-key" and "authorized_keys" in ps[0].hint


def test_missing_authorized_keys_file(tmp_path):
    ps = _problems(
        'name = "x"\n[services.ssh]\nauthorized_keys = "keys/team.pub"\n', tmp_path / "s.toml"
    )
    assert (
        ps[0].reference == "missing-file"
        and ps[0].path == "[services.ssh].authorized_keys"
        and ps[0].line == 3
    )
    assert "ENVSPEC_AUTHORIZED_KEYS" in ps[0].hint
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "team.pub").write_text(PUB + "\n")
    parse_spec(
        'name = "x"\n[services.ssh]\nauthorized_keys = "keys/team.pub"\n', tmp_path / "s.toml"
    )


def test_port_clash(tmp_path):
    ps = _problems(
        'name = "x"\n[services.jupyter]\nport = 2222\n[services.ssh]\nport = 2222\n',
        tmp_path / "s.toml",
    )
    assert ps[0].reference == "port-clash" and ps[0].path == "[services.ssh].port"
    # a disabled service holds no port
    parse_spec(
        'name = "x"\n[services.jupyter]\nport = 2222\n[services.ssh]\nport = 2222\nenabled = false\n',
        tmp_path / "s.toml",
    )


def test_port_out_of_range(tmp_path):
    ps = _problems('name = "x"\n[services.jupyter]\nport = 70000\n', tmp_path / "s.toml")
    assert ps[0].path == "[services.jupyter].port"


# --- the examples stay valid -------------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    "spec", ["team/specs/train.toml", "multi-gpu/multi-gpu.toml", "workstation/workstation.toml"]
)
def test_example_specs_parse(spec):
    from envspec.spec import load_spec

    s = load_spec(EXAMPLES / spec)
    if spec.startswith("workstation"):
        assert (
            s.services.jupyter
            and s.services.jupyter.enabled
            and s.services.ssh
            and s.services.ssh.enabled
        )
    if spec.startswith("multi-gpu"):
        assert len(s.target.gpus) >= 3


def test_team_lock_is_fresh_and_renders():
    """What `envspec lock --check` checks in the team's CI, offline."""
    from envspec.lock import load, stale_reasons
    from envspec.spec import load_spec

    lock = load(EXAMPLES / "team" / "lockfiles" / "train.lock")
    assert stale_reasons(lock, load_spec(EXAMPLES / "team" / "specs" / "train.toml")) == []
    assert list(render_service_files(lock)) == [ENTRYPOINT_IN_IMAGE]


def test_team_workflow_steps():
    text = (EXAMPLES / "team" / ".github" / "workflows" / "envspec.yml").read_text()
    for step in (
        "envspec lock --check",
        "envspec build",
        "--push",
        "digest",
        "envspec verify",
        "envspec diff",
    ):
        assert step in text, step
