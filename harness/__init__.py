"""Golden-token regression harness for Gemma 4 on ExecuTorch (XNNPACK), from fixture to Pi 5."""

__version__ = "0.1.0"
