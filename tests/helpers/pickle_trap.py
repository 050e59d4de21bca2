"""A pickled object whose unpickling runs code: it creates ``marker``. Every loader that must never execute a
pickle is tested with one; the marker must not exist afterwards."""

from __future__ import annotations

import os
from pathlib import Path


class PickleTrap:
    def __init__(self, marker: str | Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.makedirs, (self.marker,))
