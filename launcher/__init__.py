"""reproduce: run a published training recipe and judge whether its numbers hold."""

__version__ = "0.1.0"
