"""The REST API (``/api/v1``) served by ``tokentrace serve``: the app factory is
``app.api.app.create_app``."""
