"""Loading and host settings: the registry, model loading, the CPU probe, exports, datasets."""
