"""``python -m redcrawl``: the same as the ``redcrawl`` command."""

from redcrawl.cli import main

if __name__ == "__main__":
    main()
