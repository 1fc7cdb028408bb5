"""Pictures of training and of checkpoints: loss curves, the lock-in map, a sparkline.

matplotlib is an optional extra (`pip install 'astrai[plot]'`): every function that draws
imports it lazily and raises a one-line error saying how to install it; the data functions
(`read_metrics`, `series`, `ema`, `lockin_grid`, `sparkline`) need nothing beyond the core.
Figures are built with `matplotlib.figure.Figure` (no pyplot), so nothing opens a window
and no global state is touched.
"""

from astrai.viz.figure import PLOT_INSTALL, has_matplotlib, parse_size, save_figure
from astrai.viz.metrics import X_AXES, Series, ema, read_metrics, series
from astrai.viz.sparkline import sparkline

__all__ = [
    "PLOT_INSTALL", "X_AXES", "Series", "ema", "has_matplotlib", "parse_size", "read_metrics",
    "save_figure", "series", "sparkline",
]
