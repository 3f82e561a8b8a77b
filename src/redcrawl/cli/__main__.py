"""``python -m redcrawl.cli``: the redcrawl command."""

from redcrawl.cli import main

if __name__ == "__main__":
    main()
