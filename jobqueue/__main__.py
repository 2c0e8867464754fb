"""``python -m jobqueue`` is the ``jobqueue`` command."""

from jobqueue.cli import main

main()
