"""astrai: from raw text to a trained, aligned, inspected and chatting language model."""

__version__ = "0.1.0"
