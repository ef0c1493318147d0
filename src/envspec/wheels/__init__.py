"""The lock's wheels as checked files in the cache (``fetch``); where building from sdists and the
ABI check of extensions against the locked torch will go."""
