"""Signal processing: DFT, STFT, the window functions and MelWeightMatrix."""

from __future__ import annotations
