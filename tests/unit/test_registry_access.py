"""build --push's registry access: skopeo options from --authfile/--cert-dir/--tls-verify, and
what skopeo's failures mean (the messages are skopeo 1.9's, seen against docker-registry 2.8)."""

import pytest

from envspec.errors import EXIT_SOURCE, UsageError
from envspec.image.engine import RegistryAccess, push_args, registry_access, registry_error

DEST = "127.0.0.1:5000/envspec/smoke:abc"


def test_loopback_without_a_ca_is_not_verified_with_one_it_is(tmp_path):
    assert push_args(RegistryAccess(), DEST) == ["--dest-tls-verify=false"]
    assert push_args(RegistryAccess(), "registry.example/envspec/smoke:abc") == []
    a = registry_access(None, str(tmp_path), None, env={})
    assert push_args(a, DEST) == ["--dest-cert-dir", str(tmp_path)]
    assert push_args(RegistryAccess(tls_verify=False), "registry.example/x:y") == [
        "--dest-tls-verify=false"
    ]
    assert push_args(RegistryAccess(tls_verify=True), DEST) == []


def test_authfile_from_the_flag_or_registry_auth_file(tmp_path):
    f = tmp_path / "auth.json"
    f.write_text("{}")
    a = registry_access(str(f), None, None, env={"REGISTRY_AUTH_FILE": "/elsewhere"})
    assert (a.authfile, a.authfile_from) == (str(f), "--authfile")
    assert "--dest-authfile" in push_args(a, DEST)
    a = registry_access(None, None, None, env={"REGISTRY_AUTH_FILE": str(f)})
    assert (a.authfile, a.authfile_from) == (str(f), "REGISTRY_AUTH_FILE")
    assert registry_access(None, None, None, env={}).authfile == ""
    with pytest.raises(UsageError) as e:
        registry_access(None, None, None, env={"REGISTRY_AUTH_FILE": str(tmp_path / "none.json")})
    assert e.value.reference == "authfile-not-found" and "REGISTRY_AUTH_FILE" in e.value.message
    with pytest.raises(UsageError) as e:
        registry_access(None, str(tmp_path / "no-dir"), None, env={})
    assert e.value.reference == "cert-dir-not-found"


PREFIX = (
    'time="2026-12-01T18:59:08Z" level=fatal msg="trying to reuse blob sha256:1f6c at destination: '
)


@pytest.mark.parametrize(
    "stderr, reference",
    [
        (
            PREFIX
            + "checking whether a blob sha256:1f6c exists in 127.0.0.1:5000/envspec/smoke: unauthorized: "
            'authentication required"',
            "registry-auth-failed",
        ),
        (
            PREFIX
            + 'pinging container registry 127.0.0.1:5000: Get "https://127.0.0.1:5000/v2/": x509: certificate '
            'signed by unknown authority"',
            "registry-tls-failed",
        ),
        (
            PREFIX
            + 'pinging container registry 127.0.0.1:5000: Get "https://127.0.0.1:5000/v2/": dial tcp '
            '127.0.0.1:5000: connect: connection refused"',
            "registry-unreachable",
        ),
        (
            'level=fatal msg="writing blob: Patch \\"https://127.0.0.1:5000/v2/envspec/smoke/blobs/uploads/742b?_state=x\\": '
            'write tcp 127.0.0.1:57058->127.0.0.1:5000: write: broken pipe"',
            "push-interrupted",
        ),
        (
            'level=fatal msg="writing manifest: uploading manifest abc to 127.0.0.1:5000/envspec/smoke: manifest blob '
            'unknown: blob unknown to registry"',
            "push-failed",
        ),
    ],
)
def test_skopeo_failures_become_registry_errors(stderr, reference):
    e = registry_error(RegistryAccess(), DEST, stderr)
    assert e.reference == reference and e.exit_code == EXIT_SOURCE
    assert e.registry == "127.0.0.1:5000" and DEST in e.message and e.hint
    assert "skopeo said" in e.message and e.to_json()["registry"] == "127.0.0.1:5000"


def test_a_stale_registry_auth_file_only_matters_for_a_push(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    from envspec.cli import main

    lock = str(Path(__file__).resolve().parents[2] / "lockfiles" / "smoke.lock")
    monkeypatch.setenv("ENVSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(tmp_path / "gone.json"))
    assert main(["build", lock, "--dry-run"]) == 0
    capsys.readouterr()
    assert main(["build", lock, "--dry-run", "--push", DEST, "--json"]) == 2
    assert '"authfile-not-found"' in capsys.readouterr().out
