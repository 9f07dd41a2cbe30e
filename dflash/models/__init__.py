"""The models: the DFlash draft, the target wrapper and its caches, packed weights."""
