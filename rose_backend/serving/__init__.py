"""Serving (Tulip): request pool, FCFS batch former, completion side; independent of Triton (its glue
is rose_backend/triton, which imports this, never the reverse)."""
