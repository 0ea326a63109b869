"""Packaged data folders (see chaos/data.py); the folders themselves live at the top of the tree."""
