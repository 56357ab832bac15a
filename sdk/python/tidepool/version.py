"""Version of the Tidepool Python SDK."""

__version__ = "0.1.0"
