"""Models, one per file. Import from the submodules; nothing is built at import time."""
