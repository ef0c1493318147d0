"""`envspec cluster render`: an sbatch script or a Kubernetes Indexed Job that runs
`envspec verify --nnodes N` in an image pinned by digest. Runs outside images, so it may use
jinja2 (imported lazily, StrictUndefined); the templates are in envspec/templates/cluster/."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent.parent / "templates" / "cluster"
KINDS = {"slurm": "slurm.sbatch.j2", "kubernetes": "kubernetes-job.yaml.j2"}
_DIGEST_REF = re.compile(r"^(?P<repo>[a-z0-9][a-z0-9._/:-]*[a-z0-9])@(?P<digest>sha256:[0-9a-f]{64})$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$")


class RenderError(ValueError):
    """Bad arguments to render (exit code 2 at the CLI)."""


def enroot_ref(repo: str, digest: str) -> str:
    """pyxis/enroot spell a registry as REGISTRY#IMAGE: the first path part names a registry when
    it holds a '.' or ':' or is 'localhost' (the Docker reference rule)."""
    first, _, rest = repo.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}@{digest}"
    return f"{repo}@{digest}"


def render(kind: str, *, image: str, nnodes: int, gpus_per_node: int, level: str = "full",
           job_name: str = "envspec-verify", namespace: str = "default", rdzv_port: int = 29400,
           partition: str = "", time_limit: str = "00:15:00", shm_size: str = "16Gi",
           extra_args: tuple[str, ...] = ()) -> str:
    if kind not in KINDS:
        raise RenderError(f"unknown cluster kind {kind!r}: one of {', '.join(sorted(KINDS))}")
    m = _DIGEST_REF.match(image)
    if not m:
        raise RenderError(f"--image {image!r} is not pinned by digest: give REF@sha256:<64 hex> "
                          "(a tag can move between nodes, which is what verify looks for)")
    if nnodes < 1 or gpus_per_node < 0:
        raise RenderError("--nnodes must be >= 1 and --gpus-per-node >= 0")
    if not _NAME.match(job_name):
        raise RenderError(f"--job-name {job_name!r} must be a DNS label (lowercase letters, digits, '-')")
    if level not in ("quick", "full"):
        raise RenderError(f"--level must be quick or full, not {level!r}")
    import jinja2  # noqa: PLC0415 (outside images only)

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False)
    text = env.get_template(KINDS[kind]).render(
        image=image, digest=m.group("digest"), enroot_image=enroot_ref(m.group("repo"), m.group("digest")),
        nnodes=nnodes, gpus_per_node=gpus_per_node, level=level, job_name=job_name, namespace=namespace,
        rdzv_port=rdzv_port, partition=partition, time_limit=time_limit, shm_size=shm_size,
        extra_args=list(extra_args))
    return text if text.endswith("\n") else text + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="envspec cluster render",
                                description="Write an sbatch script or a Kubernetes Indexed Job running "
                                            "`envspec verify` across N nodes.")
    k = p.add_mutually_exclusive_group(required=True)
    k.add_argument("--slurm", action="store_const", const="slurm", dest="kind")
    k.add_argument("--kubernetes", action="store_const", const="kubernetes", dest="kind")
    p.add_argument("--image", required=True, metavar="REF@sha256:...")
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int, required=True)
    p.add_argument("--level", choices=("quick", "full"), default="full")
    p.add_argument("--job-name", default="envspec-verify")
    p.add_argument("--namespace", default="default")
    p.add_argument("--rdzv-port", type=int, default=29400)
    p.add_argument("--partition", default="")
    p.add_argument("--time", dest="time_limit", default="00:15:00")
    p.add_argument("--shm-size", default="16Gi")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    return p


def main(argv: list[str] | None = None) -> int:
    """`envspec cluster render ...` (argv without "cluster render"); 0 ok, 2 bad input."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["render"]:
        argv = argv[1:]
    args = build_parser().parse_args(argv)
    try:
        text = render(args.kind, image=args.image, nnodes=args.nnodes, gpus_per_node=args.gpus_per_node,
                      level=args.level, job_name=args.job_name, namespace=args.namespace,
                      rdzv_port=args.rdzv_port, partition=args.partition, time_limit=args.time_limit,
                      shm_size=args.shm_size)
    except RenderError as e:
        sys.stderr.write(f"envspec cluster render: error: {e}\n")
        return 2
    if args.output:
        from .render import write_atomic  # noqa: PLC0415

        write_atomic(args.output, text)
    else:
        sys.stdout.write(text)
    return 0
