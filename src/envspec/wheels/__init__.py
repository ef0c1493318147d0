"""The lock's wheels as checked files in the cache (``fetch``), and their extension modules checked
against the locked torch's exported symbols (``abi``); where building from sdists will go."""
