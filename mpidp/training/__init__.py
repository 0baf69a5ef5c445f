"""Data-parallel training: an MLP with a hand-written backward, DataParallel, data, optimizers."""

from .data import Dataset, ShardSampler, digits, synthetic
from .ddp import DataParallel, NaiveDataParallel
from .mlp import MLP, softmax_cross_entropy
from .optim import SGD, Adam, AdamW
from .zero import ShardedDataParallel

__all__ = ["Adam", "AdamW", "DataParallel", "Dataset", "MLP", "NaiveDataParallel", "SGD",
           "ShardSampler", "ShardedDataParallel", "digits", "softmax_cross_entropy",
           "synthetic"]
