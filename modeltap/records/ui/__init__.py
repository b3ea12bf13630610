"""`modeltap ui`: the local web viewer of a records database (see app.py); static files in static/."""

from modeltap.records.ui.app import viewer_app

__all__ = ["viewer_app"]
