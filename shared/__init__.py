"""taskfleet's shared library: schema, named SQL, pure scheduling policy, protocol, settings."""
