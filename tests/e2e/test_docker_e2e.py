"""envspec's docker path for real: Debian's dockerd, started by the test (conftest.start_dockerd:
its own data root, exec root, socket and bridge; overlay2 or vfs, cgroupfs or systemd, runc, as
``envspec.host`` finds them for podman), an envspec image loaded into it two ways, and started
with ``envspec run --engine docker`` as a user would.

- the image of lockfiles/cpu.lock, built once by ``envspec build --output docker-archive:FILE
  --push REGISTRY/...`` (a private containers-storage, a loopback docker-registry);
- ``docker load`` of the archive: docker's image ID is the config digest envspec reported; the
  archive has no manifest, so docker knows no repo digest (docs/usage.md, "docker");
- ``docker pull REGISTRY/...@sha256:<envspec's digest>``: the same image ID, and the repo digest
  is envspec's manifest digest;
- ``envspec run --engine docker LOCK -- envspec verify``: the start-up check, then the verifier
  passing with the GPU checks skipped (no GPU here);
- no daemon, and a socket nobody answers on: exit 5 naming docker, the address and the step;
- ``envspec doctor`` on this docker host: the daemon's storage driver, cgroup driver, runtimes.

The services (Jupyter's token, SSH's key) under docker are in test_services_e2e.py's docker
case (the workstation image). Skips only where docker.io, podman, buildah, skopeo or
docker-registry is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "lockfiles" / "cpu.lock"

pytestmark = [pytest.mark.e2e]
for _tool, _pkg in (
    ("dockerd", "docker.io"),
    ("docker", "docker.io"),
    ("podman", "podman"),
    ("buildah", "buildah"),
    ("skopeo", "skopeo"),
    ("docker-registry", "docker-registry"),
):
    if shutil.which(_tool) is None:
        pytest.skip(
            f"{_tool} is not installed (apt-get install -y {_pkg})", allow_module_level=True
        )
if os.geteuid() != 0:
    pytest.skip(
        "starting a dockerd of our own needs root (its bridge, its mounts)", allow_module_level=True
    )


def envspec(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    env = dict(env or os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    return subprocess.run(
        [sys.executable, "-m", "envspec", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd or ROOT,
        timeout=timeout,
    )


def report_of(stdout: str) -> dict:
    return json.loads(stdout[stdout.index("{") :])


@pytest.fixture(scope="module")
def dockerd():
    from conftest import start_dockerd

    with start_dockerd() as d:
        yield d


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``envspec build lockfiles/cpu.lock --output docker-archive:FILE --push REGISTRY/envspec/cpu:HASH
    --json``, into a private storage root; yields (its JSON, the archive, the registry, the pushed repo)."""
    from conftest import out_of_reach, private_storage, start_registry

    from envspec.lock import load

    if (why := out_of_reach(LOCK)) is not None:
        pytest.skip(why)
    base = tmp_path_factory.mktemp("docker-image")
    lock = load(LOCK)
    with private_storage(base / "storage"), start_registry(base) as registry:
        archive = base / "cpu.tar"
        repo = f"{registry}/envspec/cpu"
        cp = envspec(
            "build",
            str(LOCK),
            "--output",
            f"docker-archive:{archive}",
            "--push",
            f"{repo}:{lock.short_hash}",
            "--json",
            "--quiet",
        )
        assert cp.returncode == 0, cp.stdout + cp.stderr
        yield json.loads(cp.stdout), archive, registry, repo


@pytest.fixture(scope="module")
def loaded(dockerd, built):
    """The archive loaded into the daemon: (the image's name, docker's image inspect)."""
    out, archive, _registry, _repo = built
    cp = dockerd.docker("load", "-i", str(archive))
    assert f"Loaded image: {out['image']}" in cp.stdout, (
        cp.stdout
    )  # the archive carries the lock's tag
    return out["image"], json.loads(dockerd.docker("image", "inspect", out["image"]).stdout)[0]


def test_loaded_archive_has_envspecs_config_digest_as_its_id(built, loaded):
    out, _archive, _registry, _repo = built
    _name, inspect = loaded
    assert (
        inspect["Id"] == out["config"]
    )  # docker's image ID: the config's digest, which envspec reports
    assert (
        inspect["RepoDigests"] == []
    )  # a docker-archive holds no manifest: docker knows no repo digest
    assert (
        inspect["Id"] != out["digest"]
    )  # envspec's digest names the manifest, docker's ID the config


def test_run_with_docker_starts_checks_and_verifies(dockerd, loaded, tmp_path):
    os.chown(
        tmp_path, 1000, 1000
    )  # /workspace belongs to the image's user (uid 1000), as envspec run asks
    cp = envspec(
        "run",
        "--engine",
        "docker",
        str(LOCK),
        "--",
        "envspec",
        "verify",
        "--json",
        env=dockerd.env,
        cwd=tmp_path,
    )
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    printed = envspec(
        "run", "--engine", "docker", str(LOCK), "--print", env=dockerd.env, cwd=tmp_path
    ).stdout
    assert printed.startswith("docker run --rm -i --shm-size 1g ") and loaded[0] in printed
    r = report_of(cp.stdout)
    assert r["ok"] and r["mode"] == "image", r
    by = {f["check"]: f for f in r["findings"]}
    assert (
        by["container.shm"]["status"] == "pass"
    )  # envspec run gave the lock's --shm-size to docker
    assert by["integrity.files"]["status"] == "pass" and by["numerics.cpu"]["status"] == "pass"
    assert all(by[c]["status"] == "skip" for c in ("gpu", "libs", "numerics.gpu"))


def test_start_up_check_runs_before_the_command(dockerd, loaded, tmp_path):
    # under envspec run's flags the check passes silently, even in strict mode, and the command runs
    env = {**dockerd.env, "ENVSPEC_VERIFY": "strict"}
    cp = envspec(
        "run",
        "--engine",
        "docker",
        "--no-mount",
        str(LOCK),
        "--",
        "sh",
        "-c",
        "echo the-command-ran",
        env=env,
        cwd=tmp_path,
    )
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "the-command-ran" in cp.stdout and "at start-up" not in cp.stderr
    # a plain `docker run` (docker's 64 MB /dev/shm): the same check says so before the command runs
    cp = dockerd.docker("run", "--rm", loaded[0], "sh", "-c", "echo the-command-ran")
    assert "WARN container.shm" in cp.stderr and "1 warn at start-up" in cp.stderr, cp.stderr
    assert "the-command-ran" in cp.stdout


def test_pull_by_digest_from_the_registry_keeps_envspecs_digest(dockerd, built, loaded, tmp_path):
    out, _archive, _registry, repo = built
    ref = f"{repo}@{out['digest']}"
    dockerd.docker(
        "pull", ref
    )  # 127.0.0.0/8 registries are plain HTTP for docker without configuration
    inspect = json.loads(dockerd.docker("image", "inspect", ref).stdout)[0]
    assert inspect["Id"] == out["config"] == loaded[1]["Id"]  # one image, however it came
    assert (
        ref in inspect["RepoDigests"]
    )  # pulled by envspec's digest: the manifest the registry serves
    cp = envspec(
        "run",
        "--engine",
        "docker",
        "--no-mount",
        str(LOCK),
        "--image",
        ref,
        "--",
        "python",
        "-c",
        "import torch; print('torch', torch.__version__)",
        env=dockerd.env,
        cwd=tmp_path,
    )
    assert cp.returncode == 0 and "torch 2.13.0" in cp.stdout, cp.stdout + cp.stderr


def test_no_daemon_names_docker_the_address_and_the_step(tmp_path):
    gone = f"unix://{tmp_path}/no-daemon.sock"
    cp = envspec(
        "run",
        "--engine",
        "docker",
        str(LOCK),
        "--",
        "true",
        env={**os.environ, "DOCKER_HOST": gone},
        cwd=tmp_path,
    )
    assert cp.returncode == 5, cp.stderr
    assert "docker-unreachable" in cp.stderr and f"no daemon socket at {gone}" in cp.stderr
    assert "step: connect to the daemon" in cp.stderr

    # a socket is there, but nothing answers on it (a daemon that died and left it)
    dead = tmp_path / "dead.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(dead))
    s.close()
    cp = envspec(
        "run",
        "--engine",
        "docker",
        str(LOCK),
        "--",
        "true",
        env={**os.environ, "DOCKER_HOST": f"unix://{dead}"},
        cwd=tmp_path,
    )
    assert cp.returncode == 5, cp.stderr
    assert (
        f"the daemon at unix://{dead} did not answer" in cp.stderr and "step: connect" in cp.stderr
    )


def test_a_daemon_that_refuses_to_start_the_container_is_named(dockerd, loaded, tmp_path):
    # an envspec image the daemon lacks: said before docker run, with the ways to load it (docker
    # would try to pull localhost/envspec/... from a registry on localhost:80)
    cp = envspec(
        "run",
        "--engine",
        "docker",
        "--no-mount",
        str(LOCK),
        "--image",
        "localhost/envspec/cpu:not-there",
        "--",
        "true",
        env=dockerd.env,
        cwd=tmp_path,
    )
    assert cp.returncode == 5, cp.stdout + cp.stderr
    assert "docker-image-missing" in cp.stderr and "docker load" in cp.stderr
    assert (
        "docker's daemon has no image localhost/envspec/cpu:not-there (step: before docker run)"
        in cp.stderr
    )
    # an image docker must pull from a registry that is not there: the daemon refuses, docker exits 125
    gone = "127.0.0.1:9/envspec-e2e/nothing:here"
    cp = envspec(
        "run",
        "--engine",
        "docker",
        "--no-mount",
        str(LOCK),
        "--image",
        gone,
        "--",
        "true",
        env=dockerd.env,
        cwd=tmp_path,
    )
    assert cp.returncode == 5, cp.stdout + cp.stderr
    assert "container-start-failed" in cp.stderr
    assert f"docker run could not start the container of {gone}" in cp.stderr
    assert "step: start the container" in cp.stderr


def test_doctor_reports_the_docker_host(dockerd):
    cp = envspec("doctor", "--json", env=dockerd.env)
    findings = json.loads(cp.stdout)["findings"]
    docker = [
        f for f in findings if f["check"] == "engine" and f["detail"].get("engine") == "docker"
    ]
    assert len(docker) == 1, findings
    d = docker[0]["detail"]
    assert d["address"] == dockerd.address and d["version"]
    assert d["storage_driver"] == dockerd.args[dockerd.args.index("--storage-driver") + 1]
    assert (
        d["cgroup_driver"] == "cgroupfs"
        if "native.cgroupdriver=cgroupfs" in dockerd.args
        else "systemd"
    )
    assert "runc" in d["runtimes"] and d["default_runtime"] == "runc"
    assert (
        d["nvidia_runtime"] is False
    )  # Debian's dockerd registers none; the NVIDIA toolkit would add one
    assert docker[0]["status"] in ("ok", "info")
