"""Run one build in its own process (for the e2e fault tests): python run_build.py LOCK CACHE [--no-cache].
Prints BuiltImage.to_json() on success; exits with the error's exit code otherwise."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "src"))

from envspec import lock as lockmod  # noqa: E402
from envspec import sources  # noqa: E402
from envspec.cache.store import Cache  # noqa: E402
from envspec.errors import EXIT_INTERRUPTED, EnvspecError  # noqa: E402
from envspec.image import BuildahEngine, BuildOptions, build  # noqa: E402
from envspec.plan import make_plan  # noqa: E402


def main() -> int:
    try:
        img = build(
            make_plan(lockmod.load(sys.argv[1])),
            BuildahEngine(),
            Cache(sys.argv[2]),
            sources.discover().mirrors,
            options=BuildOptions(no_cache="--no-cache" in sys.argv),
        )
    except EnvspecError as e:
        print(e.message, file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    print(json.dumps(img.to_json()))
    return 0


if __name__ == "__main__":  # envspec.debian uses a forkserver pool, which re-imports __main__
    sys.exit(main())
