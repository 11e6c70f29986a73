"""Pictures of attention.

* :func:`heatmap` (:mod:`attnkit.viz.heatmap`) — one head or a layers × heads grid as a PNG,
  SVG or PDF (matplotlib, no display needed);
* :mod:`attnkit.viz.html` — ``render(...)`` / ``render_sections(...)`` / ``save(...)`` /
  ``view(...)``: one
  self-contained, offline HTML file with a head view, a zoomable matrix view and a layers × heads
  overview; :mod:`attnkit.viz.encoding` documents how it stores the weights (8 bits per entry);
* :mod:`attnkit.viz.weights` — the weights both take (validated), a BERT model's weights for a
  text, an encoder–decoder's self- and cross-attention weights, atomic file writing.

What a real model's heads attend to, as rich tables, lives in :mod:`attnkit.explain`.
"""

from attnkit.viz.heatmap import heatmap

__all__ = ["heatmap"]
