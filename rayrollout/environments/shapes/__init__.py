"""Shapes: count the shapes of a picture, with a zoom tool that returns an image."""
