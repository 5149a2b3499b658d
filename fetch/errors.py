"""The one exception type of moepack.fetch."""


class FetchError(RuntimeError):
    """A download, torrent or seed failed; the message names what and where."""
