"""The lock's wheels as checked files in the cache (``fetch``), their extension modules checked
against the locked torch's exported symbols (``abi``), and a wheel built from an sdist with pinned
inputs, like a derivation (``sdist``: not yet reached from lock and build, issue 37)."""
