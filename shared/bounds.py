"""The compiled bounds' refusal: raised by every check that finds a batch outside them."""

from __future__ import annotations


class BoundsError(ValueError):
    """A batch falls outside the bounds the node was compiled for; it is refused, never run."""
