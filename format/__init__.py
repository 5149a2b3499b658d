"""moepack.format"""
