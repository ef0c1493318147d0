from envspec.cli import main

raise SystemExit(main())
