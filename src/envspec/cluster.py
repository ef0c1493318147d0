"""`envspec cluster render`: an sbatch script or a Kubernetes Indexed Job that runs
`envspec verify --nnodes N` in an image pinned by digest. Runs on the host, not in images (an image
carries only what runs in it): jinja2 with StrictUndefined; the templates are in
envspec/templates/cluster/. The lock is read with the verifier's own stdlib reader, as the job's
nodes read it.

Slurm jobs start the image one of three ways (``--container``): ``pyxis`` (``srun
--container-image=...@sha256:...``, NVIDIA's pyxis/enroot plugin, what DGX clusters run),
``podman`` (``srun podman run`` per task, for clusters without pyxis) or ``none`` (the node's own
envspec against ``--lock``: host mode). With ``--lock``, the lock's NCCL settings
(``[runtime].env``'s NCCL_*) are exported to every task and its ``[runtime].shm_size`` is the
containers' /dev/shm."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import jinja2

from envspec.verify.lockfile import LockReadError, load_lock
from envspec.verify.render import write_atomic

TEMPLATES = Path(__file__).resolve().parent / "templates" / "cluster"
KINDS = {"slurm": "slurm.sbatch.j2", "kubernetes": "kubernetes-job.yaml.j2"}
CONTAINERS = ("pyxis", "podman", "none")  # how a Slurm task starts the image
NCCL_PREFIXES = ("NCCL_", "TORCH_NCCL_")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_SIZE = re.compile(r"^(?P<n>[0-9]+)(?P<unit>[kmgtKMGT]?)(?:i?[bB])?$")
DIGEST_HINT = (
    "push the image and use the digest `envspec build --push` printed, or look it up: "
    "skopeo inspect --format '{{.Digest}}' docker://REF"
)
_DIGEST_REF = re.compile(
    r"^(?P<repo>[a-z0-9][a-z0-9._/:-]*[a-z0-9])@(?P<digest>sha256:[0-9a-f]{64})$"
)
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$")


class RenderError(ValueError):
    """Bad arguments to render (exit code 2 at the CLI), with what to do about it."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


def lock_settings(path: str) -> tuple[dict[str, str], str]:
    """(NCCL environment, shm size) of a lock: ``[runtime].env``'s NCCL_* and TORCH_NCCL_* entries,
    and ``[runtime].shm_size`` ("" when unset). Read with the verifier's own stdlib reader."""
    try:
        lock = load_lock(path)
    except LockReadError as e:
        raise RenderError(
            f"--lock {path}: {e.message}", hint=e.hint or "give the lockfile of the image"
        ) from e
    runtime = lock.get("runtime", {})
    env = runtime.get("env")
    if not isinstance(env, dict):
        env = {}
    nccl = {str(k): str(v) for k, v in sorted(env.items()) if str(k).startswith(NCCL_PREFIXES)}
    bad = [k for k in nccl if not _ENV_NAME.match(k)]
    if bad:
        raise RenderError(
            f"--lock {path}: [runtime].env has names a shell cannot export: {', '.join(bad)}"
        )
    return nccl, str(runtime.get("shm_size", "") or "")


def k8s_quantity(size: str) -> str:
    """A podman/docker size ("16g", "512m") as a Kubernetes quantity ("16Gi", "512Mi"): both are binary."""
    m = _SIZE.match(size.strip())
    if not m:
        raise RenderError(f"shm size {size!r} is not a size like 16g or 512m")
    unit = m.group("unit").upper()
    return m.group("n") + (f"{unit}i" if unit else "")


def enroot_ref(repo: str, digest: str) -> str:
    """pyxis/enroot spell a registry as REGISTRY#IMAGE: the first path part names a registry when
    it holds a '.' or ':' or is 'localhost' (the Docker reference rule)."""
    first, _, rest = repo.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}@{digest}"
    return f"{repo}@{digest}"


@dataclass(frozen=True, kw_only=True)
class Job:
    """What a job file runs: `envspec verify` of ``image`` on ``nnodes`` nodes."""

    image: str  # REF@sha256:<digest>: a tag can move between nodes
    nnodes: int
    gpus_per_node: int
    level: str = "full"
    job_name: str = "envspec-verify"
    namespace: str = "default"
    rdzv_port: int = 29400
    partition: str = ""
    time_limit: str = "00:15:00"
    shm_size: str = ""  # the containers' /dev/shm (default: the lock's, else 16g)
    extra_args: tuple[str, ...] = ()
    container: str = "pyxis"  # how Slurm tasks start the image (``CONTAINERS``)
    # a lockfile whose NCCL settings and shm size the job takes (required for container "none":
    # the node's envspec verifies against it)
    lock: str = ""


def render(kind: str, job: Job) -> str:
    """The job file of ``kind`` (``KINDS``) for ``job``; ``RenderError`` for what cannot be."""
    if kind not in KINDS:
        raise RenderError(f"unknown cluster kind {kind!r}: one of {', '.join(sorted(KINDS))}")
    m = _DIGEST_REF.match(job.image)
    if not m:
        raise RenderError(
            f"--image {job.image!r} is not pinned by digest: give REF@sha256:<64 hex> "
            "(a tag can move between nodes, which is what verify looks for)",
            hint=DIGEST_HINT,
        )
    _check_container(kind, job)
    nccl, lock_shm = lock_settings(job.lock) if job.lock else ({}, "")
    shm = job.shm_size or lock_shm or "16g"
    k8s_quantity(shm)  # a size either way
    _check_shape(job)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    text = env.get_template(KINDS[kind]).render(
        image=job.image,
        digest=m.group("digest"),
        enroot_image=enroot_ref(m.group("repo"), m.group("digest")),
        nnodes=job.nnodes,
        gpus_per_node=job.gpus_per_node,
        level=job.level,
        job_name=job.job_name,
        namespace=job.namespace,
        rdzv_port=job.rdzv_port,
        partition=job.partition,
        time_limit=job.time_limit,
        shm_size=k8s_quantity(shm) if kind == "kubernetes" else shm.lower(),
        extra_args=[shlex.quote(a) for a in job.extra_args],
        container=job.container,
        lock=shlex.quote(job.lock),
        nccl=[(k, shlex.quote(v)) for k, v in nccl.items()],
        nccl_yaml=[(k, json.dumps(v)) for k, v in nccl.items()],
    )
    return text if text.endswith("\n") else text + "\n"


def _check_container(kind: str, job: Job) -> None:
    if job.container not in CONTAINERS:
        raise RenderError(
            f"--container must be one of {', '.join(CONTAINERS)}, not {job.container!r}"
        )
    if kind != "slurm" and job.container != "pyxis":
        raise RenderError("--container is for --slurm (a Kubernetes pod is the container)")
    if job.container == "none" and not job.lock:
        raise RenderError(
            "--container none runs the node's own envspec: it needs --lock LOCK to verify against",
            hint="give the lockfile the image was built from (a path every node can read)",
        )


def _check_shape(job: Job) -> None:
    if job.nnodes < 1 or job.gpus_per_node < 0:
        raise RenderError("--nnodes must be >= 1 and --gpus-per-node >= 0")
    if not _NAME.match(job.job_name):
        raise RenderError(
            f"--job-name {job.job_name!r} must be a DNS label (lowercase letters, digits, '-')"
        )
    if job.level not in ("quick", "full"):
        raise RenderError(f"--level must be quick or full, not {job.level!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="envspec cluster render",
        description="Write an sbatch script or a Kubernetes Indexed Job running "
        "`envspec verify` across N nodes.",
        epilog="examples:\n  envspec cluster render --slurm --image REG/ml/train@sha256:... "
        "--nnodes 4 --gpus-per-node 8 --lock lockfiles/h100-train.lock -o verify.sbatch\n"
        "  envspec cluster render --kubernetes --image REG/ml/train@sha256:... --nnodes 2 "
        "--gpus-per-node 8 -o verify.yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    k = p.add_mutually_exclusive_group(required=True)
    k.add_argument(
        "--slurm", action="store_const", const="slurm", dest="kind", help="an sbatch script"
    )
    k.add_argument(
        "--kubernetes",
        action="store_const",
        const="kubernetes",
        dest="kind",
        help="a Kubernetes Indexed Job with a headless Service (YAML)",
    )
    p.add_argument(
        "--image",
        required=True,
        metavar="REF@sha256:...",
        help="the image every node runs, by digest",
    )
    p.add_argument("--nnodes", type=int, required=True, help="how many nodes")
    p.add_argument(
        "--gpus-per-node",
        type=int,
        required=True,
        help="GPUs on each node (torchrun --nproc-per-node)",
    )
    p.add_argument(
        "--level",
        choices=("quick", "full"),
        default="full",
        help="envspec verify's level (default full: GEMM and the NCCL all-reduce across the nodes)",
    )
    _add_job_flags(p)
    p.add_argument(
        "--lock",
        default="",
        metavar="LOCK",
        help="the image's lockfile: its NCCL settings and shm size go into the job",
    )
    p.add_argument(
        "-o", "--output", metavar="FILE", help="write here (atomically) instead of stdout"
    )
    p.add_argument(
        "verify_args",
        nargs="*",
        metavar="-- VERIFY-ARGS",
        help="more arguments for `envspec verify` (after --)",
    )
    return p


def _add_job_flags(p: argparse.ArgumentParser) -> None:
    """How the job is named and run: its name, namespace, rendezvous port, partition, time
    limit, /dev/shm, and how Slurm starts the image."""
    p.add_argument(
        "--job-name", default="envspec-verify", help="the job's name (default envspec-verify)"
    )
    p.add_argument(
        "--namespace", default="default", help="Kubernetes: the namespace (default: default)"
    )
    p.add_argument(
        "--rdzv-port", type=int, default=29400, help="torchrun's rendezvous port (default 29400)"
    )
    p.add_argument("--partition", default="", help="Slurm: the partition (default: the cluster's)")
    p.add_argument(
        "--time",
        dest="time_limit",
        default="00:15:00",
        help="Slurm: the time limit (default 00:15:00)",
    )
    p.add_argument(
        "--shm-size", default="", help="the containers' /dev/shm (default: the lock's, else 16g)"
    )
    p.add_argument(
        "--container",
        choices=CONTAINERS,
        default="pyxis",
        help="Slurm: how each task starts the image: pyxis (srun --container-image, the default), "
        "podman (srun podman run), none (the node's envspec against --lock)",
    )


def main(argv: list[str] | None = None) -> int:
    """`envspec cluster render ...` (argv without "cluster render"); 0 ok, 2 bad input."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["render"]:
        argv = argv[1:]
    args = build_parser().parse_args(argv)
    try:
        job = Job(
            image=args.image,
            nnodes=args.nnodes,
            gpus_per_node=args.gpus_per_node,
            level=args.level,
            job_name=args.job_name,
            namespace=args.namespace,
            rdzv_port=args.rdzv_port,
            partition=args.partition,
            time_limit=args.time_limit,
            shm_size=args.shm_size,
            container=args.container,
            lock=args.lock,
            extra_args=tuple(args.verify_args),
        )
        text = render(args.kind, job)
    except RenderError as e:
        sys.stderr.write(
            f"envspec cluster render: error: {e}\n" + (f"hint: {e.hint}\n" if e.hint else "")
        )
        return 2
    if args.output:
        write_atomic(args.output, text)
    else:
        sys.stdout.write(text)
    return 0
