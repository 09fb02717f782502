"""`python -m fleet.cli`, as the `laneway` script."""

from fleet.cli import main

main()
