"""SWE-bench-style instances run in their own images (``swe-image``)."""
