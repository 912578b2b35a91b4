"""Serving (Tulip): request pool, FCFS batch former, completion side; the Triton glue lives in triton_rose.py."""
