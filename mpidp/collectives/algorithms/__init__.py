"""The textbook: every collective algorithm, and the vocabulary they share.

Nothing here imports from outside this folder (NumPy aside).
"""
