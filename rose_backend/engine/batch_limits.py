"""The largest batch by default: its tokens and sequences. The `rose` parameters max_batch_tokens and
max_batch_seqs default to these, and so do the engine's buckets and precompile's shapes. Imports
nothing, so that the tokenize stubs (no torch) read the same numbers."""
BATCH_TOKENS = 16384
BATCH_SEQS = 64
