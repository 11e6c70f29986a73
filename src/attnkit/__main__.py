"""``python -m attnkit`` runs the command-line tool."""

from attnkit.cli import main

raise SystemExit(main())
