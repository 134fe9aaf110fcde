"""Results: the SQLite store (append-only, versioned) and pytest-benchmark interop."""
