"""Files the stages write and read: atomic writes, and readers of stage outputs with one-line errors."""
