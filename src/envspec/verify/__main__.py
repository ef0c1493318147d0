import sys

argv = sys.argv[1:]
if "--startup" in argv:  # the container start-up hook: no argparse, no torch, no full verifier
    from envspec.verify.startup import hook, startup_args

    own, lock_path = startup_args(argv)
    if own:
        raise SystemExit(hook(None, lock_path=lock_path))

from envspec.verify.cli import main  # noqa: E402 (the hook's path above does without it)

raise SystemExit(main(argv))
