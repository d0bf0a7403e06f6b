"""`make sample-data`: writes the bundled sample datasets (genfleet/demo.py) into OUT_DIR,
examples/data by default.  python examples/make_sample_data.py [OUT_DIR] [--scale 1.0]"""
from pathlib import Path

from genfleet.demo import main

main(default_out=Path(__file__).resolve().parent / "data")
