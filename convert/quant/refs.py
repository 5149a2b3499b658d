"""What an encoder may need besides the codec object and the weights."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from moepack.convert.quant.rvq import RvqSettings


@dataclass(frozen=True)
class EncodeRefs:
    """The layer's codebook and rotation signs (rvq), encoder settings and threads."""

    codebook: np.ndarray | None = None
    rotation: np.ndarray | None = None
    settings: RvqSettings | None = None
    threads: int = 1
