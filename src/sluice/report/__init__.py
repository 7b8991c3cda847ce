"""``sluice report``'s plotted and machine-readable forms: a job's report as data
(:func:`build_report`, what ``--json`` prints) and as one self-contained HTML file
(:func:`render_html`, what ``--html`` writes). The text form is ``sluice.batch``'s."""

from __future__ import annotations

from ._aggregate import FORMAT, build_report
from ._html import render_html

__all__ = ["FORMAT", "build_report", "render_html"]
