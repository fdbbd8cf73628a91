"""A tasks module that fails to import, as one with a bad setting or a syntax slip does."""

raise RuntimeError("this module cannot be imported")
