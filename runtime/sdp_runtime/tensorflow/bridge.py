"""Moving tensors between TensorFlow and torch without copying, on the CPU and on GPUs.

TF tensors and torch tensors share memory through DLPack, both ways, in eager mode and inside a
``tf.function`` (where the collectives run in a ``tf.py_function``, whose body is eager and gets
its inputs as eager tensors on the device the op runs on). Nothing here copies, except:

* TF's CPU kernels assume 64-byte aligned buffers (Eigen checks it and aborts the process), so a
  torch CPU tensor that does not start on such an address is copied on its way to TF;
* a GPU tensor that the other framework cannot address goes through host memory: a TF GPU
  tensor when torch has no CUDA (a CPU build of torch beside a CUDA TensorFlow), a torch CUDA
  tensor on a GPU TF does not see.

GPUs. DLPack names a GPU by the framework's own index, and the two frameworks may number the same
GPU differently: after ``tf.config.set_visible_devices(gpus[local_rank], "GPU")`` (what
sdp-convert writes) TF calls its one GPU ``GPU:0`` while torch, which sees every GPU, calls it
``cuda:<local_rank>``. The index in the DLPack capsule is rewritten on the way through
(:func:`torch_gpu_index`, :func:`tf_gpu_index`). The two frameworks also run kernels on their own
CUDA streams: a TF tensor is handed over only once TF's work on its GPU is done (``SyncDevice``),
and a torch result only once torch's stream is done, so that neither reads memory the other is
still writing.

Callers must never write into a view of a TF tensor: TF tensors are immutable and their buffers
are shared with variables and cached constants.
"""

from __future__ import annotations

import ctypes
import functools

import tensorflow as tf
import torch

#: Byte alignment TF expects of every tensor buffer (EIGEN_MAX_ALIGN_BYTES on AVX-512 builds).
TF_ALIGNMENT = 64

# DLPack's ABI (dlpack.h, stable since v0.6): DLManagedTensor starts with a DLTensor, whose
# fields are ``void* data; int32 device_type; int32 device_id; int32 ndim; ...``.
_DEVICE_TYPE_OFFSET = ctypes.sizeof(ctypes.c_void_p)
_DEVICE_ID_OFFSET = _DEVICE_TYPE_OFFSET + 4
_NDIM_OFFSET = _DEVICE_ID_OFFSET + 4
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def dlpack_fields(capsule: object) -> tuple[int, int, int, int]:
    """``(data pointer, device type, device id, ndim)`` of an unconsumed DLPack capsule.

    Arguments:
        capsule: a ``"dltensor"`` capsule, from ``tf.experimental.dlpack.to_dlpack`` or
            ``torch.utils.dlpack.to_dlpack``.

    Example:
        >>> dlpack_fields(torch.utils.dlpack.to_dlpack(torch.zeros(2)))[1:]  # kDLCPU is 1
        (1, 0, 1)
    """
    address = _capsule_pointer(capsule, b"dltensor")
    data = ctypes.c_void_p.from_address(address).value or 0
    return (
        data,
        ctypes.c_int32.from_address(address + _DEVICE_TYPE_OFFSET).value,
        ctypes.c_int32.from_address(address + _DEVICE_ID_OFFSET).value,
        ctypes.c_int32.from_address(address + _NDIM_OFFSET).value,
    )


def _set_dlpack_device_id(capsule: object, device_id: int) -> None:
    address = _capsule_pointer(capsule, b"dltensor")
    ctypes.c_int32.from_address(address + _DEVICE_ID_OFFSET).value = device_id


def gpu_ordinals(visible: list[str], logical: int) -> list[int] | None:
    """CUDA ordinals of TF's logical GPUs ``GPU:0``, ``GPU:1``, ..., in order.

    TF's logical GPU i is its i-th visible physical GPU (``/physical_device:GPU:<ordinal>``)
    unless visible GPUs are split into virtual ones, where the mapping is not known: None.

    Arguments:
        visible: names of ``tf.config.get_visible_devices("GPU")``.
        logical: number of ``tf.config.list_logical_devices("GPU")``.

    Example:
        >>> gpu_ordinals(["/physical_device:GPU:3"], 1)  # set_visible_devices(gpus[3], "GPU")
        [3]
    """
    if len(visible) != logical:
        return None
    return [int(name.rsplit(":", 1)[1]) for name in visible]


@functools.cache
def _ordinals() -> list[int] | None:
    visible = [d.name for d in tf.config.get_visible_devices("GPU")]
    return gpu_ordinals(visible, len(tf.config.list_logical_devices("GPU")))


def torch_gpu_index(tf_index: int) -> int | None:
    """torch's ``cuda:<i>`` for TF's ``GPU:<tf_index>``; None if torch cannot address it."""
    if not torch.cuda.is_available():
        return None
    ordinals = _ordinals()
    ordinal = ordinals[tf_index] if ordinals is not None else tf_index
    return ordinal if ordinal < torch.cuda.device_count() else None


def tf_gpu_index(torch_index: int) -> int | None:
    """TF's ``GPU:<i>`` for torch's ``cuda:<torch_index>``; None if TF does not see that GPU."""
    ordinals = _ordinals()
    if ordinals is None:
        return torch_index if torch_index < len(tf.config.list_logical_devices("GPU")) else None
    return ordinals.index(torch_index) if torch_index in ordinals else None


def tf_to_torch(tensor: tf.Tensor) -> torch.Tensor:
    """Return a torch view of an eager TF tensor (zero copy, same device).

    A GPU tensor is handed over once TF's work on that GPU is done; it is copied to the host
    only if torch cannot address its GPU (a CPU build of torch).

    Arguments:
        tensor: an eager ``tf.Tensor`` (a variable must be read first).

    Example:
        >>> view = tf_to_torch(tf.ones([2]))  # do not modify ``view`` in place
    """
    device = tensor.backing_device
    if ":GPU:" not in device:  # a string test: this runs for every tensor of every call
        return torch.from_dlpack(tensor)
    index = torch_gpu_index(tf.DeviceSpec.from_string(device).device_index or 0)
    if index is None:
        with tf.device("/CPU:0"):
            return torch.from_dlpack(tf.identity(tensor))
    with tf.device(tensor.backing_device):
        tf.raw_ops.SyncDevice()  # TF's kernels that write ``tensor`` have finished
    capsule = tf.experimental.dlpack.to_dlpack(tensor)
    _set_dlpack_device_id(capsule, index)
    return torch.from_dlpack(capsule)


def torch_to_tf(tensor: torch.Tensor) -> tf.Tensor:
    """Return an eager TF tensor sharing the memory of ``tensor`` (zero copy).

    The TF tensor keeps the torch storage alive, so ``tensor`` must not be written afterwards.
    A CPU tensor that is not contiguous or not aligned to :data:`TF_ALIGNMENT` bytes is copied;
    a CUDA tensor is handed over once torch's stream is done, through the host if TF does not
    see its GPU.

    Arguments:
        tensor: a torch tensor.

    Example:
        >>> torch_to_tf(torch.arange(3.0))
    """
    if tensor.is_cuda:
        torch.cuda.current_stream(tensor.device).synchronize()
        index = tf_gpu_index(tensor.device.index)
        if index is None:
            tensor = tensor.cpu()
        else:
            tensor = tensor.contiguous()
            capsule = torch.utils.dlpack.to_dlpack(tensor)
            _set_dlpack_device_id(capsule, index)
            return tf.experimental.dlpack.from_dlpack(capsule)
    if not tensor.is_contiguous() or tensor.data_ptr() % TF_ALIGNMENT:
        tensor = tensor.clone(memory_format=torch.contiguous_format)
    return tf.experimental.dlpack.from_dlpack(tensor.__dlpack__())
