"""moepack.convert"""
