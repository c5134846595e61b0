"""Code: write a Python function; a sandboxed subprocess runs it and its tests."""
