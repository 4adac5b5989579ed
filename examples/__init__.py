"""Runnable examples; each module has a ``main()`` returning what it printed, exercised by tests/test_examples.py."""
