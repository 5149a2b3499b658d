"""moepack.fetch"""
