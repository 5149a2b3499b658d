"""`moepack serve`: an OpenAI-compatible HTTP server and a chat page over one Engine."""
