"""Session-wide settings of the test suite."""

import os

# A local build starts `envspec cache compress` in the background (cli.build._compress_in_background); a
# test suite that builds hundreds of images would leave as many processes compressing into temp
# caches it removes. Off here; tests/e2e/test_compress_e2e.py turns it on for the test of it.
os.environ.setdefault("ENVSPEC_BACKGROUND_COMPRESS", "off")
