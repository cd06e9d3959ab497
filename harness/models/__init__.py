"""Where a model comes from: the committed fixture, the benchmark-size config, a local checkpoint
(flat or multimodal layout); one spec resolver. Part of every artifact's cache key."""
