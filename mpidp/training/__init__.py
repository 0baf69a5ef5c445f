"""Data-parallel training: an MLP and a GPT (hand-written backward), DataParallel, data, optim."""

from .clipping import clip_grad_norm
from .data import Dataset, ShardSampler, digits, synthetic
from .ddp import DataParallel, NaiveDataParallel
from .gpt import GPT
from .mlp import MLP, softmax_cross_entropy
from .optim import SGD, Adam, AdamW

__all__ = ["Adam", "AdamW", "DataParallel", "Dataset", "GPT", "MLP", "NaiveDataParallel", "SGD",
           "ShardSampler", "clip_grad_norm", "digits", "softmax_cross_entropy",
           "synthetic"]
