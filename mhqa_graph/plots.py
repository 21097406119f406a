"""Headless matplotlib for the PNGs the library, its trainers and its bench scripts write.

    plt = pyplot()
    fig, ax = plt.subplots()
    ...
    save_png(fig, "out/curve.png")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """`matplotlib.pyplot` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig: Any, out: str | Path, dpi: int = 100) -> Path:
    """Lay `fig` out tightly, write it to `out` (its folder made if missing), close it; returns the path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=dpi)
    pyplot().close(fig)
    return out
