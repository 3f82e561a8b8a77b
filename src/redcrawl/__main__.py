"""``python -m redcrawl``: the same as the ``redcrawl`` command."""

from redcrawl.cli import main

main()
