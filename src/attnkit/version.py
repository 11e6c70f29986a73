"""attnkit's version, in one place below every layer: the package (``attnkit.__version__``),
``attnkit --version``, ``attnkit info`` and the tuning store's machine key read it. No attnkit
dependencies."""

__version__ = "0.1.0"
