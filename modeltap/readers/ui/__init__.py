"""`modeltap ui`: the local web viewer of a records database (see app.py); static files in static/."""

from modeltap.readers.ui.app import viewer_app

__all__ = ["viewer_app"]
