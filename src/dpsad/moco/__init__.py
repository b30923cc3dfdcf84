"""MoCo v2 features and k-means pseudo-labels (paper Section 4.2) for data without usable labels."""
