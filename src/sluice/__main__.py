"""``python -m sluice`` is the ``sluice`` command."""

from ._entry import main

main()
