"""``python -m redcrawl.cli``: the redcrawl command."""

from redcrawl.cli import main

main()
