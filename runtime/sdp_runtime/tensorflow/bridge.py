"""Moving tensors between TensorFlow and torch without copying.

Eager TF tensors and torch tensors share memory through DLPack; inside a ``tf.function`` the data
arrives in a ``tf.numpy_function`` as NumPy arrays, which torch views with ``torch.from_numpy``.
NumPy has no bfloat16 of its own (TF uses ``ml_dtypes.bfloat16``), so those arrays are viewed as
uint16 on the way in and out.

Nothing here copies, with one exception: TF's CPU kernels assume 64-byte aligned buffers (Eigen
checks it and aborts the process), so a torch tensor that does not start on such an address is
copied on its way to TF. Callers must never write into a view of a TF tensor: TF tensors are
immutable and their buffers are shared with variables and cached constants.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import torch

_BF16_NUMPY = tf.bfloat16.as_numpy_dtype

#: Byte alignment TF expects of every tensor buffer (EIGEN_MAX_ALIGN_BYTES on AVX-512 builds).
TF_ALIGNMENT = 64


def tf_to_torch(tensor: tf.Tensor) -> torch.Tensor:
    """Return a torch view of an eager TF tensor (zero copy, same device).

    Arguments:
        tensor: an eager ``tf.Tensor`` (a variable must be read first).

    Example:
        >>> view = tf_to_torch(tf.ones([2]))  # do not modify ``view`` in place
    """
    return torch.from_dlpack(tensor)


def torch_to_tf(tensor: torch.Tensor) -> tf.Tensor:
    """Return an eager TF tensor sharing the memory of ``tensor`` (zero copy).

    The TF tensor keeps the torch storage alive, so ``tensor`` must not be written afterwards.
    A tensor that is not contiguous or not aligned to :data:`TF_ALIGNMENT` bytes is copied.

    Arguments:
        tensor: a torch tensor.

    Example:
        >>> torch_to_tf(torch.arange(3.0))
    """
    if not tensor.is_contiguous() or tensor.data_ptr() % TF_ALIGNMENT:
        tensor = tensor.clone(memory_format=torch.contiguous_format)
    return tf.experimental.dlpack.from_dlpack(tensor.__dlpack__())


def numpy_to_torch(array: np.ndarray) -> torch.Tensor:
    """View a NumPy array (as given to a ``tf.numpy_function``) as a torch tensor."""
    array = np.asarray(array)
    if array.dtype == _BF16_NUMPY:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def torch_to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """View a CPU torch tensor as a NumPy array TF accepts (bfloat16 as ``ml_dtypes``)."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(_BF16_NUMPY)
    return tensor.numpy()
