"""The shipped demo model and the `make demo` driver."""
