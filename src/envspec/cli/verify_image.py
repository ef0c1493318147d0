"""`envspec verify-image REF --key PUB`: a pushed image checked in its registry.

The stages are imported inside the handlers: every command's module is imported when the
command line starts, and `envspec explain` must not pay for the others' libraries
(docs/benchmarks.md, explain).
"""

from __future__ import annotations

import argparse
import sys

from envspec.cli.common import JSON_HELP, Subparsers, bool_flag, command, print_json


def cmd_verify_image(args: argparse.Namespace) -> int:
    from envspec.image.engine import registry_access
    from envspec.registry.verify_image import RegistryReader, load_public_key, verify_image
    from envspec.verify.render import table

    key = load_public_key(args.key)
    lock = None
    if args.lock:
        from envspec.lock import load

        lock = load(args.lock)
    reader = RegistryReader(
        registry_access(args.authfile, args.cert_dir, bool_flag("--tls-verify", args.tls_verify))
    )
    report = verify_image(args.ref, key, reader, lock, lock_path=args.lock or "")
    report.lock_name = args.ref
    if args.json:
        print_json(report.to_dict())
    else:
        sys.stdout.write(table(report))
    return report.exit_code


def add_verify_image(sub: Subparsers) -> None:
    s = command(
        sub,
        "verify-image",
        help="check a pushed image's signature, provenance and lock in its registry",
        description="Check a pushed image in its registry, without pulling it: its signature against the "
        "signer's key, its SLSA provenance and SBOM attestations, and that it was built from "
        "the given lock (each layer's content key).",
        examples=[
            "envspec verify-image registry.example/ml/train:v3 --key signing.pub "
            "--lock lockfiles/h100-train.lock"
        ],
    )
    s.add_argument("ref", metavar="REF", help="HOST/REPO:TAG or HOST/REPO@sha256:...")
    s.add_argument("--key", required=True, metavar="PUB", help="the signer's public key (PEM)")
    s.add_argument("--lock", metavar="LOCK", help="the lock the image must have been built from")
    s.add_argument(
        "--authfile", metavar="PATH", help="registry credentials (default: $REGISTRY_AUTH_FILE)"
    )
    s.add_argument("--cert-dir", metavar="DIR", help="trust the CA certificates (*.crt) in DIR")
    s.add_argument(
        "--tls-verify", metavar="true|false", help="verify TLS (default: yes, except on loopback)"
    )
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s.set_defaults(func=cmd_verify_image)
