"""moepack.verify"""
