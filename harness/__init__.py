"""Golden-token regression harness for Gemma 4 on ExecuTorch (XNNPACK), from fixture to Pi 5."""

import os as _os

__version__ = "0.1.0"

# transformers 5.25's from_pretrained turns use_kernels=None into True unless USE_HUB_KERNELS is
# off: layers are then swapped for kernels the `kernels` package fetches from the Hub at run time
# (outside code, other modules than the ones exported, network on machines that have none). Every
# load passes use_kernels=False too (harness/models/load.py); this covers the process as a whole,
# and is set before transformers is imported (it reads the variable at import).
_os.environ["USE_HUB_KERNELS"] = "0"
