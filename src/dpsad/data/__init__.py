"""Data sources, splits and the prepared ``data.h5`` file."""
