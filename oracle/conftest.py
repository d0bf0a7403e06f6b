"""oracle/ runs only in .oracle-venv (make oracle): its modules import each other by name."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for path in (str(HERE), str(HERE.parent)):
    if path not in sys.path:
        sys.path.insert(0, path)
