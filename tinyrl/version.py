"""tinyrl's version, in a module of its own that imports nothing, so that any module can name it
without importing the `tinyrl` package (whose functions import the API, which imports the exporter)."""

__version__ = "0.1.0"
