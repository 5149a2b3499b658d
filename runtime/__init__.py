"""The C engine (runtime/src) and its thin ctypes binding."""
