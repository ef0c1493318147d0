from envspec.verify.cli import main

raise SystemExit(main())
