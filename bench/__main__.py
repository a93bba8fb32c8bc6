"""``python -m bench``: the whole benchmark suite (see bench.suite)."""

from bench.suite import main

main()
