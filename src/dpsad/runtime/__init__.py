"""The distributed runtime: the training processes of one job, started by torch's launcher, and their end."""
