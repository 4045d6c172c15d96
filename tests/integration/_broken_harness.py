"""A harness module that cannot even be imported (for the 'cannot start' test)."""

raise RuntimeError("this harness is broken on purpose")
