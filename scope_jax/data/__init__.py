"""Data: the bundled demo corpus, document clusters, and per-method stores."""
