import sys

if "--startup" in sys.argv[1:]:  # the container start-up hook: no argparse, no torch, no full verifier
    from envspec.verify.startup import main
else:
    from envspec.verify.cli import main

raise SystemExit(main())
