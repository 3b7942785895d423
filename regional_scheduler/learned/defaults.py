"""The learned policy's defaults that the ``meridian`` CLI shows in its options.

Standard library only: ``meridian --help`` reads these while registering ``train placement`` and
``explain``, and must not import torch or numpy to do so. :mod:`.serving` and :mod:`.augment`
re-export them under their old names.
"""

from __future__ import annotations

from pathlib import Path

# The committed checkpoint (checkpoints/README.md): what serving loads unless told otherwise.
DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "placement.pt"

# The openb pod lists the `gpu` profile trains on (the checkpoints README's split); the other nine are held out.
TRAINING_LISTS = ("cpu0", "cpu037", "cpu050", "cpu072", "cpu100", "cpu200", "cpu235", "cpu250", "cpu300",
                  "gpushare20", "gpushare40", "gpushare80", "gpushare100")
