"""python -m rose_backend.launch: what `make serve` runs (serve.py)."""
import sys

from rose_backend.launch.serve import main

sys.exit(main())
