from moepack.cli import app

app()
