"""trainguard: keeps LLM training runs from failing silently."""
__version__ = "0.1.0"
