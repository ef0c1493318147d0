"""The image's entrypoint and service files (Jupyter, SSH), rendered from the lock with jinja2.

The build's envspec layer includes what ``render_service_files`` returns; ``envspec run`` only
needs the paths. Templates: ``templates/entrypoint.sh.j2`` and ``templates/services/``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from envspec.errors import PlanError
from envspec.lock import Lockfile, RuntimeLock, keys_sha256

if TYPE_CHECKING:
    import jinja2

WORKSPACE = "/workspace"
ENTRYPOINT_IN_IMAGE = "/opt/envspec/entrypoint.sh"
SERVICES_DIR = "/opt/envspec/services"
AUTHORIZED_KEYS_IN_IMAGE = "/opt/envspec/authorized_keys"
ENVSPEC_LIB = "/opt/envspec/lib"
_KEY_TYPES = re.compile(
    r"(^|\s)(ssh-ed25519|ssh-rsa|ssh-dss|ecdsa-sha2-nistp\d+|sk-ssh-ed25519@openssh\.com|"
    r"sk-ecdsa-sha2-nistp256@openssh\.com)\s+[A-Za-z0-9+/]+=*(\s|$)"
)


def _templates() -> jinja2.Environment:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).resolve().parent / "templates")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def check_authorized_keys(text: str, source: str = "authorized_keys") -> str:
    """Public keys only, one per line; raises ``PlanError`` on a private key or a line that is not a key."""
    if "PRIVATE KEY" in text:
        raise PlanError(
            f"{source} holds a PRIVATE key; it must list public keys (*.pub) only",
            hint="put the contents of ~/.ssh/id_ed25519.pub there, never the key itself",
            reference="private-key-in-spec",
        )
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            out.append(s)
            continue
        if not _KEY_TYPES.search(s):
            raise PlanError(
                f"{source}:{n}: not an OpenSSH public key line",
                reference="bad-authorized-keys",
                hint="each line: [options] ssh-ed25519 AAAA... comment",
            )
        out.append(s)
    return "\n".join(out).strip() + "\n" if any(out) else ""


def authorized_keys_file(lock: Lockfile, spec_dir: str | Path | None) -> Path | None:
    """The authorized-keys file that the lock's enabled [services.ssh] names (relative to
    ``spec_dir``, else to the lock's ``meta.spec``), read when the image is built; None: none."""
    ssh = lock.services.ssh
    if ssh is None or not ssh.enabled or not ssh.authorized_keys:
        return None
    p = Path(ssh.authorized_keys)
    if not p.is_absolute():
        base = Path(spec_dir) if spec_dir is not None else Path(lock.meta.spec or ".").parent
        p = base / p
    return p


def _keys_text(lock: Lockfile, spec_dir: str | Path | None) -> str:
    p = authorized_keys_file(lock, spec_dir)
    if p is None:
        return ""
    ssh = lock.services.ssh
    assert ssh is not None
    try:
        text = p.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError):
        raise PlanError(
            f"[services.ssh].authorized_keys: no such file: {p}",
            reference="missing-file",
            hint="the path is relative to the spec; or leave it empty and pass keys at run time in "
            "ENVSPEC_AUTHORIZED_KEYS",
        ) from None
    if ssh.authorized_keys_sha256 and keys_sha256(text) != ssh.authorized_keys_sha256:
        raise PlanError(
            f"{p} changed since the lock was written (its sha256 is in [services.ssh] of the lock)",
            hint="run `envspec lock` again so the image's tag follows the keys it carries",
            reference="lock-out-of-date",
        )
    return check_authorized_keys(text, str(p))


def _session_env(venv: str, rt: RuntimeLock) -> str:
    """What an ssh session's environment needs from the image: the venv on PATH, the lock's env.
    Values that sshd_config cannot quote (double quotes, newlines) are left out."""
    out = [("PATH", f"{venv}/bin:/usr/local/bin:/usr/bin:/bin"), ("VIRTUAL_ENV", venv)]
    for k, v in sorted(rt.env.items()):
        if '"' not in v and "\n" not in v and k not in ("PATH", "VIRTUAL_ENV"):
            out.append((k, v))
    return " ".join(f'"{k}={v}"' for k, v in out)


def render_service_files(
    lock: Lockfile, *, spec_dir: str | Path | None = None, authorized_keys: str | None = None
) -> dict[str, tuple[str, int]]:
    """The entrypoint and the enabled services' files, rendered from the lock:
    ``{path in image: (text, mode)}``. Nothing secret is rendered: no token, no password, no host
    key; the authorized keys (public) come from the spec's file (``authorized_keys`` text, else the
    file named in the lock, relative to ``spec_dir`` or to the lock's ``meta.spec``)."""
    rt, services = lock.runtime, lock.services
    state_dir = f"/tmp/envspec-{rt.uid}"
    common = {
        "name": lock.meta.name,
        "short_hash": lock.short_hash,
        "venv": lock.platform.venv,
        "user": rt.user,
        "uid": rt.uid,
        "workdir": "/" + rt.workdir.strip("/"),
        "state_dir": state_dir,
        "ssh_dir": f"{state_dir}/ssh",
        "services_dir": SERVICES_DIR,
        "envspec_lib": ENVSPEC_LIB,
        "authorized_keys_in_image": AUTHORIZED_KEYS_IN_IMAGE,
        "sshd_config_in_image": f"{SERVICES_DIR}/sshd_config",
    }
    enabled = services.enabled()
    env = _templates()
    files: dict[str, tuple[str, int]] = {
        ENTRYPOINT_IN_IMAGE: (
            env.get_template("entrypoint.sh.j2").render(**common, services=enabled),
            0o755,
        ),
    }
    if services.jupyter is not None and services.jupyter.enabled:
        j = services.jupyter
        files[f"{SERVICES_DIR}/jupyter.sh"] = (
            env.get_template("services/jupyter.sh.j2").render(
                **common, port=j.port, extensions=list(j.extensions)
            ),
            0o755,
        )
    if services.ssh is not None and services.ssh.enabled:
        s = services.ssh
        files[f"{SERVICES_DIR}/ssh.sh"] = (
            env.get_template("services/ssh.sh.j2").render(**common, port=s.port),
            0o755,
        )
        files[f"{SERVICES_DIR}/sshd_config"] = (
            env.get_template("services/sshd_config.j2").render(
                **common, port=s.port, session_env=_session_env(lock.platform.venv, rt)
            ),
            0o644,
        )
        keys = (
            check_authorized_keys(authorized_keys, "authorized_keys")
            if authorized_keys is not None
            else _keys_text(lock, spec_dir)
        )
        if keys:
            files[AUTHORIZED_KEYS_IN_IMAGE] = (keys, 0o644)
    return dict(sorted(files.items()))
