"""The REST API: start cases, read them, read their trail, cancel them.

``app`` builds the FastAPI application and its routes, ``schemas`` the request
bodies, ``middleware`` what wraps every request.
"""

from casetrail.api.app import create_app

__all__ = ["create_app"]
