"""``python -m taskfleet.cli``: the same as the ``taskfleet`` command."""

from taskfleet.cli.main import main

main()
