"""moepack: a container format and toolkit for streaming huge Mixture-of-Experts models."""

__version__ = "0.1.0"
