"""pymetaq's benchmark scripts (``python -m bench``): not part of the package, never collected."""
