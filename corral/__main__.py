"""``python -m corral`` runs the ``corral`` command."""

from corral._launch import main

main()
