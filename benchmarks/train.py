"""Alias of benchmarks/train_throughput.py (astrai training tokens/s vs HF Llama)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from train_throughput import main

if __name__ == "__main__":
    main()
