"""How the committed fixture was trained, and the ablations its training must make matter.
Not part of any artifact's cache key (the fixture's weights hash is)."""
