"""SageMaker model parallelism's TensorFlow API (``smdistributed.modelparallel.tensorflow``) on
sdp_runtime, for ``import sdp_runtime.tensorflow.smp as smp``.

TensorFlow has no FSDP: the whole model is trained on every process (data parallel), whatever
the number of partitions configured (``smp.init`` says so when more than one is asked for), and
``smp.partition`` only runs its body. ``@smp.step`` splits the batch into ``microbatches`` along
the first axis (see :mod:`sdp_runtime._smp_step`); ``smp.get_gradients(loss, variables)`` (for
Keras 2's ``optimizer.get_gradients``) differentiates with the step's tape and averages the
gradients over the processes, so that ``g.accumulate()`` is the gradient of the whole global
batch; SMP's Horovod recipe, which allreduces them again, gets the same values.
"""

from __future__ import annotations

from .api import *  # noqa: F403 (api lists its public names in __all__)
from .api import __all__  # noqa: F401
