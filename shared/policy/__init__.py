"""Pure scheduling policy. No I/O, no database or web imports (checked by import-linter)."""
