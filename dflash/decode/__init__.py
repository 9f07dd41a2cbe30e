"""The decoding loop and its proposers: the engine, one block's step, the events and statistics."""
